"""Translate with a trained checkpoint: stdin -> stdout by default, one output line per input line.

    python translate.py checkpoint=runs/NAME < in.txt > out.txt
    python translate.py checkpoint=runs/NAME input=in.txt output=out.txt references=ref.txt decode.beam_size=5
    python translate.py checkpoint=runs/NAME decode.nbest=3          # "i ||| hypothesis ||| score" lines
    python translate.py checkpoint=runs/NAME references=test_2016_flickr   # a split of the training data config
    python translate.py checkpoint=[runs/A,runs/B] < in.txt             # an ensemble (mean log-probabilities)
    python translate.py checkpoint=runs/NAME glossary=terms.tsv < in.txt  # the glossary's terms in the output
    python translate.py checkpoint=runs/NAME constraints=cons.txt < in.txt  # per line: target phrases, tab-separated

Only translations go to stdout; logs and the score go to stderr (and report.json/md with `references`).
"""

import sys

from mt.cli import check_command_line
from mt.config_checks import to_dataclass

if __name__ == "__main__":  # a bad override or value answers before torch loads
    check_command_line("translate", check=to_dataclass)

import logging

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from mt.model import saved
from mt.config import TranslateConfig, register_configs
from mt.errors import USER_ERRORS
from mt.decode.confidence import check_confidence_model
from mt.decode.loading import glossary_of, run_decode_settings
from mt.evaluate.translate_files import translate_stream, translate_whole
from mt.runtime import keep_freed_memory_in_the_heap, pick_device, prefer_expandable_segments
from mt.decode.translator import Translator

log = logging.getLogger("translate")
register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="translate")
def main(dcfg: DictConfig) -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(message)s", force=True)
    prefer_expandable_segments()
    keep_freed_memory_in_the_heap()  # beam search's cache buffers and logits would otherwise page-fault anew
    try:
        cfg: TranslateConfig = to_dataclass(dcfg)
        ckpts = [saved.load(path) for path in cfg.checkpoint]  # several: an ensemble
        ckpt = ckpts[0]  # whose run's decoding settings and data config apply
        d = cfg.decode = run_decode_settings(cfg.decode, ckpt, list(HydraConfig.get().overrides.task))
        translator = Translator.open(ckpts, d, pick_device(cfg.device), cfg.precision, bool(cfg.plot_attention),
                                     cfg.tgt_lang, cfg.src_lang)  # fmt: skip
        log.info("translating %s with %s", translator.direction(), ckpt["path"])
        log.info(
            "decoding: beam %d, length penalty %s %g (the run's settings unless given as decode.*)",
            d.beam_size,
            d.length_penalty_type,
            d.length_penalty,
        )
        check_confidence_model(translator, cfg.confidence)
        translator.target_id()  # a multilingual model without tgt_lang: the one-line error before reading input
        translator.glossary = glossary_of(cfg)
        if cfg.glossary or cfg.constraints:  # refused now, not at the first line that holds a term
            translator.check_terms(d, f"glossary={cfg.glossary}" if cfg.glossary else f"constraints={cfg.constraints}")
        if cfg.references or cfg.plot_attention:  # these need the whole input
            translate_whole(cfg, translator)
        else:
            translate_stream(cfg, translator)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
