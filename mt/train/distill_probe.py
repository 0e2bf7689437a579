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


def speed_ratio(teacher: Translator, model: ModelConfig, vocab_size: int, lines: list[str]) -> SpeedProbe:
    """The student shape `model`'s decoding speed over the teacher's, on the first `SAMPLE` of `lines`."""
    lines = [line for line in lines if line.strip()][:SAMPLE]
    src = [s for s in teacher.encode_sources(lines) if s]
    _, hyps = teacher.hypotheses(lines, teacher.settings(beam_size=BEAM, nbest=1))
    tokens = max(1, round(sum(len(h[0].tokens) for h in hyps) / max(len(hyps), 1)))
    forced = teacher.settings(beam_size=BEAM, nbest=1, min_len=tokens, max_len=tokens + 1)
    teacher_s = seconds(lambda: teacher.hypotheses(lines, forced))
    torch.manual_seed(0)
    student = Transformer(model, vocab_size, vocab_size).to(teacher.device).eval()
    ids = [[4 + i % (vocab_size - 4) for i in s][: model.max_positions - 2] for s in src]  # the same lengths
    student_s = seconds(lambda: translate_ids(student, ids, forced, teacher.device, None))
    parameters = sum(p.numel() for p in student.parameters())
    return SpeedProbe(teacher_s / max(student_s, 1e-9), tokens, len(lines), parameters)
