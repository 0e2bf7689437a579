"""How much faster the student will decode than its teacher, measured before the student exists.

A student is worth its training when it is fast: `+experiment=distill` wants it to decode at least
`distill.min_speedup` times the teacher's sentences/s on this machine. Its speed depends on its shape, its vocabulary
and how many tokens it writes, not on what it learned, so an untrained model of the configured shape (random
weights, `tokenizer.vocab_size` types) is timed against the loaded teacher on the same sources, both in this
project's beam search at the same beam, both forced to write the same number of tokens (the teacher's mean output
length on those sources): without the forcing an untrained model writes until the length limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mt.config import ModelConfig
from mt.decode.batched import translate_ids
from mt.decode.translator import Translator
from mt.model.transformer import Transformer

SAMPLE = 64  # sentences timed
BEAM = 4  # the beam both are timed at (as stage 3 and the benchmarks time them)


@dataclass
class SpeedProbe:
    ratio: float  # the student's sentences/s over the teacher's
    tokens: int  # the output length both were held to
    sentences: int
    student_parameters: int

    def describe(self, model_name: str) -> str:
        return (f"the student (model={model_name}, {self.student_parameters / 1e6:.1f}M parameters, untrained) decodes "
                f"{self.ratio:.1f}x the teacher's sentences/s here ({self.sentences} training sources, beam {BEAM}, "
                f"{self.tokens} tokens each)")  # fmt: skip


def seconds(work: Callable[[], object]) -> float:
    work()  # warm-up: the first call pays for allocations
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


class StudentTimer:
    """The teacher timed once on the first `SAMPLE` of `lines`, then any student shape against it."""

    def __init__(self, teacher: Translator, lines: list[str]):
        self.teacher, self.lines = teacher, [line for line in lines if line.strip()][:SAMPLE]
        self.src = [s for s in teacher.encode_sources(self.lines) if s]
        _, hyps = teacher.hypotheses(self.lines, teacher.settings(beam_size=BEAM, nbest=1))
        self.tokens = max(1, round(sum(len(h[0].tokens) for h in hyps) / max(len(hyps), 1)))
        self.forced = teacher.settings(beam_size=BEAM, nbest=1, min_len=self.tokens, max_len=self.tokens + 1)
        self.teacher_s = seconds(lambda: teacher.hypotheses(self.lines, self.forced))

    def ratio(self, model: ModelConfig, vocab_size: int) -> SpeedProbe:
        """The student shape `model`'s decoding speed over the teacher's."""
        torch.manual_seed(0)
        device = self.teacher.device
        student = Transformer(model, vocab_size, vocab_size).to(device).eval()
        ids = [[4 + i % (vocab_size - 4) for i in s][: model.max_positions - 2] for s in self.src]  # same lengths
        student_s = seconds(lambda: translate_ids(student, ids, self.forced, device, None))
        parameters = sum(p.numel() for p in student.parameters())
        return SpeedProbe(self.teacher_s / max(student_s, 1e-9), self.tokens, len(self.lines), parameters)


def speed_ratio(teacher: Translator, model: ModelConfig, vocab_size: int, lines: list[str]) -> SpeedProbe:
    """The student shape `model`'s decoding speed over the teacher's, on the first `SAMPLE` of `lines`."""
    return StudentTimer(teacher, lines).ratio(model, vocab_size)


# The student shapes `+experiment=distill` chooses among, largest first: deep encoders and shallow decoders (the
# decoder runs once per output token and beam, the encoder once a sentence). Bergamot's "tiny" students (Firefox
# Translations: 6 encoder and 2 decoder layers, d 256, FFN 1,536) under base-size teachers; this project's compact
# deep-shallow shape (conf/model/transformer_compact_deep_shallow.yaml) under compact ensembles; a narrower one.
SHAPE_KEYS = ("d_model", "n_heads", "d_ff", "encoder_layers", "decoder_layers")  # what a STUDENT_SHAPES entry sets
STUDENT_SHAPES = {
    "bergamot_tiny": dict(d_model=256, n_heads=8, d_ff=1536, encoder_layers=6, decoder_layers=2),
    "transformer_compact_deep_shallow": dict(d_model=128, n_heads=4, d_ff=512, encoder_layers=8, decoder_layers=1),
    "compact_deep_shallow_narrow": dict(d_model=128, n_heads=4, d_ff=256, encoder_layers=6, decoder_layers=1),
}


def choose_student(probes: dict[str, SpeedProbe], min_speedup: float) -> tuple[str, str]:
    """(shape, why): the largest of `probes` (in STUDENT_SHAPES' order) at `min_speedup` or more, else the fastest."""
    for name, probe in probes.items():
        if probe.ratio >= min_speedup:
            return name, f"the largest shape at {min_speedup:g}x the teacher's speed or more ({probe.ratio:.1f}x)"
    name = max(probes, key=lambda n: probes[n].ratio)
    return (
        name,
        f"WARNING: no shape reaches {min_speedup:g}x the teacher's speed; the fastest ({probes[name].ratio:.1f}x)",
    )
