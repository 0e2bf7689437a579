"""Typed configuration schemas, registered in Hydra's ConfigStore.

The YAML files in `conf/` fill these dataclasses. Because the top-level schema is typed, a misspelt override
(`train.max_epoch=3`) or a wrong type (`train.max_epochs=many`) is rejected by Hydra before anything runs.
Core code receives these dataclasses (converted with `OmegaConf.to_object`), never a raw `DictConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the key and what to do."""


@dataclass
class CorpusConfig:
    """One training corpus of `data.corpora`: where it is (as `data`'s fields say it for the main corpus; unset =
    the main corpus's value), a tag put before every source sentence, and its weight in the mix."""

    name: str = ""  # default: the dir's name
    format: str | None = None
    dir: str | None = None
    hub_name: str | None = None
    columns: list[str] | None = None
    src_lang: str | None = None
    tgt_lang: str | None = None
    train_split: str | None = None
    # A special token (e.g. "<bt>", tagged back-translation: Caswell et al. 2019) put at the start of every source
    # sentence of this corpus; registered in the vocabulary as one id.
    tag: str | None = None
    # Pairs drawn per epoch, per pair of the corpus: 2 = every pair twice (upsampling the real data against
    # back-translations), 0.5 = a different half every epoch.
    weight: float = 1.0


@dataclass
class DataConfig:
    name: str = MISSING
    # "parallel": {dir}/{split}.{lang}[.gz]; "tsv": {dir}/{split}.tsv (columns in `columns`);
    # "jsonl": {dir}/{split}.jsonl ({"en": .., "de": ..} or {"translation": {..}}); "tmx": {dir}/{split}.tmx[.gz]
    # (a translation memory, mt/data/tmx.py); "hub": load_dataset(hub_name).
    format: str = "parallel"
    dir: str | None = None
    hub_name: str | None = None
    hub_config: str | None = None
    # Use the hub when `dir` does not exist (e.g. Multi30k for users without the local copy).
    hub_fallback: bool = False
    # Required: every data group names its languages (a local corpus's come from the command line).
    src_lang: str = MISSING
    tgt_lang: str = MISSING
    # TSV column order, e.g. ["en", "de"].
    columns: list[str] = field(default_factory=list)
    train_split: str = "train"
    valid_split: str = "val"
    test_splits: list[str] = field(default_factory=list)
    # Split names as the hub calls them, when they differ from ours: {val: validation}.
    hub_splits: dict[str, str] = field(default_factory=dict)
    # Filters on training pairs, counted in BPE tokens (without </s>).
    max_len: int = 250
    max_ratio: float = 3.0
    # Where tokenized corpora are cached (datasets' Arrow cache); null = datasets' default.
    cache_dir: str | None = None
    # Training corpora mixed by weight, each tokenized and cached on its own; empty = the corpus above alone. The
    # validation and test splits stay the corpus above's (real data, never synthetic).
    corpora: list[CorpusConfig] = field(default_factory=list)
    # One model for several directions of a multi-way corpus (Johnson et al. 2017), e.g. [en-de, en-fr, en-cs]:
    # each direction's sources start with the target-language token <2de>; every direction is validated and
    # tested (selection on the mean). Empty = the one direction src_lang -> tgt_lang.
    directions: list[str] = field(default_factory=list)
    # Hold out this many training pairs of the main corpus (drawn by train.seed, not trained on) as the validation
    # set, for a corpus without a validation split (valid_split is then not read). 0 = off.
    valid_from_train: int = 0
    # How training batches are formed (mt/data/batching.py): "pools" (sorted by target length in shuffled pools,
    # re-formed every epoch) or "fixed" (fairseq's: sorted by source then target length once, batch sizes a
    # multiple of 8, the same batches every epoch in a new order).
    batching: str = "pools"


BATCH_FORMATIONS = ("pools", "fixed")  # data.batching (mt/data/batching.py)
PRETOKENIZERS = ("none", "moses")  # tokenizer.pretokenize: none, or Moses (mt/data/pretokenize.py)


@dataclass
class TokenizerConfig:
    vocab_size: int = 8000
    joint: bool = True
    min_frequency: int = 2
    # Normalization applied before BPE, to training text and to every input: one of NORMALIZERS, or several joined
    # by "+" and applied in order. NFC keeps text identical for any NFC input (round trip holds); "NFC+Lowercase"
    # trains a lowercased model (as fairseq's and JoeyNMT's IWSLT/Multi30k recipes do): it translates into
    # lowercase, and its validation BLEU, which selects checkpoints, is the lowercased one.
    normalization: str = "NFC"
    # BPE is learned from a uniform random sample of this many training pairs (0 = all of them); the counts used
    # are recorded in tokenizer.meta.json. A million pairs learn the merges of a WMT-size corpus (fairseq and
    # SentencePiece recipes sample similarly) in a fraction of the time and memory.
    sample_pairs: int = 1_000_000
    # Load this tokenizer.json instead of training one.
    path: str | None = None
    # "moses": Moses-tokenize source and target (in data.src_lang / data.tgt_lang) before the BPE, and detokenize
    # translations after it (mt/data/pretokenize.py), as fairseq's recipes prepare text; saved with the tokenizer.
    pretokenize: str = "none"
    # Case markup (mt/data/casing.py, OpenNMT's case_markup): the BPE and the model see lowercase words, each word
    # that was capitalized or in capitals preceded by a mark, and translations are cased again from the marks: the
    # vocabulary of a lowercased model with cased output. Saved with the tokenizer.
    case_markup: bool = False
    # The share of the training text's characters the BPE's alphabet covers (SentencePiece's character_coverage);
    # the rest read as <unk>. Unset: all of them, unless the alphabet takes over a quarter of the vocabulary (Chinese,
    # Japanese: over 1,000 characters), then 0.9995 of them, at most half the vocabulary (mt/data/alphabet.py).
    character_coverage: float | None = None


@dataclass
class ModelConfig:
    name: str = MISSING
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    encoder_layers: int = 6
    decoder_layers: int = 6
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    # "post" is the paper's LayerNorm(x + Sublayer(x)); "pre" is x + Sublayer(LayerNorm(x)) plus final norms.
    norm: str = "post"
    # "all": source emb = target emb = output projection (joint vocab); "decoder": target emb = output; "inputs":
    # source emb = target emb, the output projection its own (joint vocab); "none".
    tie_embeddings: str = "all"
    positions: str = "sinusoidal"  # or "learned"
    max_positions: int = 1024
    # "xavier": every weight matrix xavier_uniform, biases 0 (this project's); "fairseq": fairseq 0.12's transformer
    # (Q, K, V each xavier_uniform with gain 1/sqrt(2), PyTorch's default for their biases and for the FFN)
    init: str = "xavier"
    # What checkpoints of other toolkits need (mt/model/hub/: transformers' Marian and M2M100), the paper's values
    # by default; a fine-tuning run takes them from its parent.
    activation: str = "relu"  # of the feed-forward layers (3.3): relu | swish (Marian) | gelu
    scale_embedding: bool = True  # 3.4: embeddings x sqrt(d_model)
    sinusoids: str = "paper"  # paper (3.5, sin/cos interleaved) | halves (Marian) | fairseq (M2M100, NLLB)
    position_offset: int = 0  # the first position's row of the table (fairseq's sinusoids: the padding id + 1)
    output_bias: bool = False  # a fixed bias added to the logits (Marian's final_logits_bias)
    mask_pad_logit: bool = False  # <pad>'s logit is -inf before the softmax (Marian gives it a trained logit)
    # Special token ids (this project's tokenizers: <pad> 0, <unk> 1, <s> 2, </s> 3). The decoder reads
    # decoder_start_id first: <s> here, <pad> in Marian, </s> in M2M100 and NLLB.
    pad_id: int = 0
    unk_id: int = 1
    decoder_start_id: int = 2
    eos_id: int = 3


@dataclass
class TrainConfig:
    seed: int = 1
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: str = "auto"  # auto (bf16 on AMX CPUs from d_model 256 and on bf16 GPUs) | fp32 | bf16 | fp16 (CUDA)
    compile: bool = False
    max_tokens: int = 4096  # per batch, padded tokens (max of source and target side)
    accumulate: int = 1
    max_epochs: int = 100
    max_updates: int = 0  # 0 = no limit
    max_time: float = 0.0  # minutes of training wall-clock; 0 = no limit
    optimizer: str = "adam"  # adam | adamw
    lr: float = 5e-4  # peak lr for inverse_sqrt, linear and constant
    # noam | inverse_sqrt | linear (to 0 at the end of max_updates/max_time) | constant (after warmup)
    schedule: str = "noam"
    noam_scale: float = 1.0
    cooldown: float = 0.0  # last fraction of max_updates/max_time over which any schedule's lr falls linearly to 0
    warmup: int = 4000
    warmup_init_lr: float = 1e-7
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    clip_norm: float = 0.0
    label_smoothing: float = 0.1
    rdrop_alpha: float = 0.0  # R-Drop: the weight of the two dropout passes' symmetric KL (0 = off; 2x compute)
    tgt_word_dropout: float = 0.0  # each decoder-input token -> <unk> with this probability (mt/train/regularize.py)
    # BPE-dropout (Provilkov et al., 2020): each epoch re-segments the training pairs skipping each merge with this
    # probability; validation, test and translate.py keep the deterministic segmentation. 0 = off.
    bpe_dropout: float = 0.0
    # Exponential moving average of the weights (mt/train/ema.py): validated, checkpointed and kept as the run's model
    # while the raw weights train; e.g. 0.999. 0 = off.
    ema_decay: float = 0.0
    ema_validate_raw: bool = True  # with ema_decay: also validate the raw weights (metrics "raw_valid_*")
    valid_every: int = 0  # updates; 0 = once per epoch
    valid_bleu: bool = True
    valid_bleu_subset: int = 0  # sentences of val decoded for BLEU; 0 = all
    patience: int = 0  # validations without improvement of val BLEU before stopping; 0 = off
    keep_last: int = 3  # epoch checkpoints (weights) kept; written only when this or average_last is above 0
    average_last: int = 0  # average the last K epoch checkpoints at the end; 0 = off
    # Minutes between writes of checkpoint_last.pt (what a resume continues from), also inside an epoch; 0 = at the
    # end of every epoch. Every stop (budget, signal, end) writes it. Set it where epochs take seconds (a GPU).
    save_every: float = 0.0
    # torch.use_deterministic_algorithms(True): bitwise repeatable CUDA runs, at some cost in speed.
    deterministic: bool = False
    resume: str = "auto"  # auto | never | path to a checkpoint
    # Continue a run although this command changes what decides its batches or updates (train.lr, max_tokens,
    # data, world size, ...: mt.train.checkpoint.RESUME_KEYS); without it such a resume stops with an error.
    resume_anyway: bool = False
    # Start a new run from a trained model (a run dir, a .pt or a release): its weights, tokenizer and architecture;
    # optimizer, schedule, counters, best score and data order start fresh (mt/train/finetune.py).
    init_from: str | None = None
    init_optimizer: bool = False  # with init_from: carry the parent's Adam moments over (of a run dir: its last)
    freeze: list[str] = field(default_factory=list)  # parts that do not train: embeddings, encoder, decoder
    # With init_from, at the end: the parent on this run's test splits (`{split}.before`: the gain) and this run on
    # the parent's own test splits (`parent.{split}`: what it kept).
    test_parent: bool = True
    max_nan_updates: int = 5
    # torchrun: minutes the other ranks wait while rank 0 alone prepares the corpus or validates (NCCL's own
    # timeout, 10 minutes, would end a first WMT run during its BPE and tokenization).
    wait_timeout: float = 120.0
    log_every: int = 50
    progress: bool = True
    # Also write metrics.jsonl's scalars to RUN_DIR/tb/ for TensorBoard; null = when the package is installed.
    tensorboard: bool | None = None


@dataclass
class DecodeConfig:
    beam_size: int = 5
    length_penalty: float = 1.0  # GNMT alpha; 0 = raw log-prob
    length_penalty_type: str = "gnmt"  # gnmt ((5+len)/6)^alpha | average (score / len^alpha)
    max_len_a: float = 1.5
    max_len_b: int = 10
    max_len: int = 0  # at most this many output tokens (</s> included) whatever the source; 0 = the model's positions
    min_len: int = 0  # tokens before </s> may be chosen (fairseq --min-len); for benchmarks with forced lengths
    nbest: int = 1
    no_unk: bool = False
    max_tokens: int = 8000  # source tokens per decoding batch
    use_cache: bool = True
    quantize: str = "none"  # none | int8: int8 weights in every linear layer for CPU decoding (mt/model/quantize.py)
    # Sampling instead of search (beam_size 1): each token drawn from the model's distribution at `temperature`,
    # restricted to the `topk` most probable (0 = all) and to the smallest set of mass >= `topp` (1.0 = all);
    # `nbest` samples per line. Reproducible: line i's draws come from (seed, i) alone, whatever the batching.
    sampling: bool = False
    topk: int = 0
    topp: float = 1.0
    temperature: float = 1.0
    seed: int = 0
    # Constraints (translate.py constraints=/glossary=): unordered (each phrase anywhere) | ordered (in the given order)
    constraint_order: str = "unordered"
    # Beam search with a length penalty ends a sentence's search once beam_size hypotheses have ended (true:
    # fairseq's rule, transformers' early_stopping=True), or (false: transformers' default) only when moreover no
    # live beam, scored at its current length, beats the worst of them. Without a length penalty the search ends
    # when no live beam can beat the best ones, either way.
    early_stopping: bool = True
    # Score tokens against the distribution left after the search's restrictions (forced prefix and </s> at the
    # length limit, banned tokens) rather than the model's (transformers' renormalize_logits, set by OPUS-MT's
    # generation config): a forced token then scores 0.
    renormalize: bool = False
    # A token the search forces (a prefix's, a target-language token, </s> at the length limit) adds its
    # log-probability to the hypothesis's score (true), or 0 (false: transformers' forced BOS and EOS, which an
    # imported checkpoint's generation config implies).
    score_forced: bool = True


@dataclass
class AutoConfig:
    """`+experiment=auto` (mt/train/auto.py): the recipe chosen from the corpus and the budget."""

    enabled: bool = False
    # Time the candidate model shapes on this machine (seconds, cached); false: mt/train/probe.py's table
    probe: bool = True
    # Check, probe and plan, log the plan and write auto.json, then stop without training (a later run in the same
    # run dir trains with that plan).
    dry_run: bool = False


DISTILL_MIXES = ("both", "distilled")  # distill.mix


@dataclass
class DistillConfig:
    """`+experiment=distill` (mt/train/distill.py): a small student trained on a teacher's translations (sequence-
    level knowledge distillation, Kim & Rush 2016)."""

    enabled: bool = False
    # Anything translate.py's checkpoint= takes: a run dir, a release, a transformers folder or Hub id, or a list of
    # them [A,B,C] (an ensemble). null = no distillation.
    teacher: Any = None
    # More source-language text for the teacher to translate, one sentence a line (plain or .gz), as much as fits
    # the teacher's share of the budget, in order; null = the training sources only.
    source_text: str | None = None
    # What the student trains on: "both" = the original pairs and the teacher's translations of their sources
    # (and of source_text), mixed; "distilled" = the teacher's translations alone.
    mix: str = "both"
    # The largest share of train.max_time the teacher's translating may take; beyond it the run is refused (the
    # training sources) or the text is cut (distill.source_text).
    teacher_share: float = 0.5
    # Where the teacher's translations are kept, one folder per (teacher, text, decoding settings), for every run.
    cache_dir: str = "runs/teacher_translations"
    chunk_lines: int = 1000  # lines translated between two records of progress (a resume loses at most these)
    # The test splits scored with the teacher too, beside the student (report.json's "teacher" and "student").
    test_teacher: bool = True
    # The student's decoding speed over the teacher's that the plan wants (timed before training,
    # mt/train/distill_probe.py); a student shape under it is warned about. 0 = not timed.
    min_speedup: float = 5.0
    translate_only: bool = False  # stage 1 alone: the teacher fills cache_dir, no student is trained
    # decode.* settings for stage 1 only, over the teacher's own (e.g. {beam_size: 1}: greedy, several times faster);
    # the teacher is scored with its own settings. Part of the cache's key.
    teacher_decode: dict[str, Any] = field(default_factory=dict)


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    auto: AutoConfig = field(default_factory=AutoConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    run_dir: str = MISSING


@dataclass
class TranslateConfig:
    # A run dir (its final checkpoint), a .pt file, a release or a CTranslate2 export; a list [A,B,...] of the first
    # three decodes them as an ensemble (mt/decode/ensemble.py).
    checkpoint: Any = MISSING
    input: str = "-"  # a file, or - for stdin
    input_errors: str = "strict"  # bytes that are not UTF-8: strict (a one-line error naming the line) | replace
    # Lines read, translated and written at a time: memory stays bounded for any input (without references and
    # plot_attention, which need the whole input).
    stream_lines: int = 10000
    output: str = "-"  # a file, or - for stdout
    output_format: str = "text"  # text | jsonl: {"text", "score", "flags"} a line (mt/decode/confidence.py)
    flag_below: float | None = None  # jsonl: lines scored under it get the flag low_score
    confidence: str = "logprob"  # jsonl: logprob | mc_dropout (+ "mc_mean", "mc_var" over mc_passes dropout passes)
    mc_passes: int = 10
    # A file of target prefixes, one per input line (an empty line = none): each translation starts with its prefix.
    prefix: str | None = None
    # Terminology (mt/decode/constraints.py): a file of target phrases each line's translation must contain, one
    # line per input line, phrases separated by tabs (an empty line = none); and/or a glossary, TSV "source
    # term<TAB>target term": the terms whose source side occurs in a line (whole words) become its constraints.
    constraints: str | None = None
    glossary: str | None = None
    glossary_ignore_case: bool = False  # source terms match whatever their case
    # Each line a paragraph (or a document's line): translated sentence by sentence (mt/decode/segment.py), joined
    # back with its own spacing and indentation. Off by default: a test set has one sentence per line.
    split: bool = False
    tgt_lang: str | None = None  # the target language of a multilingual model (data.directions); others ignore it
    # The source language of a model that reads one (NLLB: de or deu_Latn); default: the run's data.src_lang.
    src_lang: str | None = None
    references: str | None = None  # a file, or a split name of the checkpoint's data config (e.g. test_2016_flickr)
    report_dir: str | None = None  # where report.json/md go; default: next to the output
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    device: str = "auto"
    precision: str = "fp32"
    plot_attention: str | None = None
    attention_layer: int = -1


@dataclass
class ServeConfig:
    # a run dir, .pt, release dir or CTranslate2 export; several models: [RUN_A, RUN_B] or {de: RUN_A, fr: RUN_B}
    checkpoint: Any = MISSING
    host: str = "127.0.0.1"
    port: int = 8080
    tgt_lang: str | None = None  # a multilingual model's default target language (a request's "tgt_lang" wins)
    src_lang: str | None = None  # the source language of a model that reads one (NLLB); default: the run's
    glossary: str | None = None  # a TSV glossary applied to every request (translate.py's glossary=)
    glossary_ignore_case: bool = False
    device: str = "auto"
    precision: str = "fp32"
    decode: DecodeConfig = field(default_factory=DecodeConfig)  # the run's settings unless given as decode.*
    # Requests arriving within batch_wait_ms of each other (or while a batch decodes) are decoded together, up to
    # batch_tokens source tokens.
    batch_wait_ms: float = 5.0
    batch_tokens: int = 4000
    # Decoder rows (sentences x beam or samples) one decode holds at most; a batch over it is decoded in even parts.
    # 1024 holds 32 clients' 4-sentence requests at beam 5 in one decode (512 cut them 102 + 26 sentences: 0.8x
    # the requests/s, benchmarks/reliability/serve_load.py --compare).
    batch_rows: int = 1024
    # Per request: larger ones get a 413 with a one-line error.
    max_sentences: int = 64  # counted after "split": true splits the lines into sentences
    max_glossary_terms: int = 1000  # terms in a request's own "glossary"
    max_request_tokens: int = 4000  # source tokens, counted before lines are cut to the model's positions
    max_beam: int = 16
    max_body_bytes: int = 1_000_000  # a larger request body is refused (413) before it is read to the end
    max_output_tokens: int = 256  # a served translation's length cap (decode.max_len), whatever the source
    max_queue_tokens: int = 32000  # source tokens all waiting requests may hold; beyond: 503 with Retry-After
    request_timeout_s: float = 60.0  # a request not answered by then gets a 503 (and is not decoded later)
    # Who may call (mt/serve/access.py): a file of keys (name:key per line), re-read on change or SIGHUP; per key
    # (or client address without keys) requests and source tokens per minute, 0 = no limit; beyond: 429.
    api_keys: str | None = None
    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    access_log: bool = True  # one line per request on stderr (key name, status, sentences, tokens, latency)


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    cs.store(name="translate_schema", node=TranslateConfig)
    cs.store(name="serve_schema", node=ServeConfig)


def checkpoint_list(value) -> list[str]:
    """translate.py's `checkpoint=`: one path, or a list of paths (an ensemble), as a non-empty list of strings."""
    paths = [value] if isinstance(value, str | Path) else list(value)
    if not paths or not all(isinstance(p, str | Path) and str(p) for p in paths):
        raise ConfigError(f"checkpoint={value!r}: give a path, or a list of paths [A,B] to decode as an ensemble")
    return [str(p) for p in paths]


def _choice(key: str, value: str, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ConfigError(f"{key}={value!r} is not one of {', '.join(options)}; fix the override or config file")


def validate_decode(cfg: DecodeConfig) -> None:
    """Search settings, shared by train.py (validation and test) and translate.py."""
    _choice("decode.length_penalty_type", cfg.length_penalty_type, ("gnmt", "average"))
    _choice("decode.quantize", cfg.quantize, ("none", "int8"))
    _choice("decode.constraint_order", cfg.constraint_order, ("unordered", "ordered"))
    for key, value, low in (
        ("decode.max_tokens", cfg.max_tokens, 1),
        ("decode.max_len_a", cfg.max_len_a, 0.0),
        ("decode.max_len_b", cfg.max_len_b, 0),
        ("decode.min_len", cfg.min_len, 0),
        ("decode.max_len", cfg.max_len, 0),
    ):
        if value < low:
            raise ConfigError(f"{key}={value} is below its minimum {low}; fix the override or config file")
    if cfg.max_len_a == 0 and cfg.max_len_b < 1:
        raise ConfigError("decode.max_len_a=0 and decode.max_len_b=0 allow no output token; raise max_len_b")
    if cfg.sampling:
        validate_sampling(cfg)
    elif cfg.beam_size < 1 or not 1 <= cfg.nbest <= cfg.beam_size:
        raise ConfigError(
            f"decode.beam_size={cfg.beam_size}, decode.nbest={cfg.nbest}: "
            "need beam_size >= 1 and 1 <= nbest <= beam_size"
        )


def validate_sampling(cfg: DecodeConfig) -> None:
    if cfg.beam_size != 1:
        raise ConfigError(f"decode.sampling=true draws each token: it needs decode.beam_size=1, not {cfg.beam_size} "
                          "(decode.nbest=N gives N samples per line)")  # fmt: skip
    if cfg.nbest < 1:
        raise ConfigError(f"decode.nbest={cfg.nbest}: the samples per line must be at least 1")
    if cfg.topk < 0:
        raise ConfigError(f"decode.topk={cfg.topk}: give the number of most probable tokens to draw from, 0 = all")
    if not 0.0 < cfg.topp <= 1.0:
        raise ConfigError(f"decode.topp={cfg.topp} is outside (0, 1]: the probability mass to draw from, 1.0 = all")
    if not cfg.temperature > 0.0:
        raise ConfigError(f"decode.temperature={cfg.temperature} must be above 0 (1.0 = the model's distribution)")


def parse_direction(direction: str, where: str = "data.directions") -> tuple[str, str]:
    """ "en-de" -> ("en", "de"), or a one-line ConfigError."""
    src, _, tgt = direction.partition("-")
    if not src or not tgt or "-" in tgt or src == tgt:
        raise ConfigError(f"{where}: {direction!r} is not a direction; write source-target, e.g. en-de")
    return src, tgt
