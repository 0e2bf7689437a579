"""Train a Transformer translator: `python train.py [+experiment=NAME] [group=option] [key=value ...]`.

Data -> BPE -> model -> teacher-forced training with validation -> best/averaged checkpoint -> test report.
Multi-GPU or multi-process CPU: `torchrun --nproc_per_node=N train.py ...`.
"""

import sys

from mt.cli import check_command_line
from mt.config_checks import to_dataclass

if __name__ == "__main__":  # a bad override or value answers before torch and datasets load
    check_command_line("config", check=to_dataclass)

import logging
import time
from pathlib import Path

import datasets
import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from mt.train import auto_ranks, auto_setup, distill, distill_report, distributed, finetune
from mt.config import register_configs
from mt.data.corpus import prepare_data
from mt.data.read import check_splits
from mt.errors import USER_ERRORS
from mt.export.formats import export_ctranslate2
from mt.train.checkpoint import check_run_dir
from mt.train.finish import finish
from mt.run_dir import remove_if_unused
from mt.runtime import keep_freed_memory_in_the_heap, prefer_expandable_segments
from mt.train.trainer import Trainer, restore_signal_handlers

log = logging.getLogger("train")
register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(dcfg: DictConfig) -> None:
    job_start = time.time()
    keep_freed_memory_in_the_heap()
    prefer_expandable_segments()
    try:
        cfg = to_dataclass(dcfg)
        if not cfg.train.progress or not sys.stderr.isatty():  # no bars (none from `datasets` either): off, or a log
            datasets.disable_progress_bars()
        cfg.data = check_splits(cfg.data)  # every split's files, before the probe, the BPE and the budget
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        check_run_dir(cfg, run_dir)  # a run dir of another corpus or direction, as instantly
        rank = distributed.init_distributed(cfg.train.device, cfg.train.wait_timeout)
        distributed.check_shared_run_dir(run_dir)
        if rank != 0:
            logging.getLogger().setLevel(logging.WARNING)
        if cfg.distill.enabled:  # stage 1: the teacher's translations become the training corpora (mt/train/distill.py)
            overrides = list(HydraConfig.get().overrides.task)
            cfg = auto_ranks.agree(cfg, lambda: distill.prepare(cfg, run_dir, job_start, overrides))
            if cfg.distill.translate_only:
                log.info("distill.translate_only: the teacher's translations are in %s (distill.json says which "
                         "folder holds which text); no student trained", cfg.distill.cache_dir)  # fmt: skip
                return
        if cfg.auto.enabled:  # the recipe chosen from the corpus and the budget (mt/train/auto.py)
            cfg = auto_setup.configure(cfg, run_dir, list(HydraConfig.get().overrides.task), job_start)
            if cfg.auto.dry_run:
                log.info("auto.dry_run: the plan is above and in %s; nothing trained", run_dir / "auto.json")
                return
        # Rank 0 trains the tokenizer and fills the cache (or `python -m mt.prepare` did); the others then reuse both.
        parent = finetune.load_parent(cfg, run_dir) if cfg.train.init_from else None
        if parent is not None:  # its architecture and tokenizer
            cfg = finetune.adopt(cfg, parent, list(HydraConfig.get().overrides.task))
        if rank != 0:
            distributed.wait_for_rank0()
        corpus = prepare_data(cfg, run_dir, cfg.model.max_positions, parent.vocabs if parent else None)
        if rank == 0:
            distributed.wait_for_rank0()
        trainer = Trainer(cfg, corpus, run_dir)
        resumed = trainer.resume()
        if not resumed and parent is not None:
            finetune.start(trainer, parent)
        if rank == 0:  # written once the run dir's checkpoints are known to belong to this config
            # the config as trained: with a fine-tuning run's parent's architecture and tokenizer (finetune.adopt)
            (run_dir / "config.resolved.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
        reason = trainer.fit(job_start, resume=False)
        restore_signal_handlers()
        if reason in ("SIGINT", "SIGTERM"):
            log.warning(
                "interrupted (%s) at update %d; checkpoint saved in %s; run the same command to resume",
                reason,
                trainer.update,
                run_dir,
            )
            sys.exit(130 if reason == "SIGINT" else 143)
        minutes = trainer.budget.elapsed / 60
        log.info("training stopped (%s) after %d updates, %.1f min", reason, trainer.update, minutes)
        if cfg.auto.enabled and reason == "max_time" and rank == 0 and not resumed:  # the plan against the run
            precision = auto_setup.probe_precision(cfg)
            if warning := auto_setup.check_plan(run_dir, trainer.update, cfg.auto.probe, precision):
                log.warning(warning)
        if rank == 0:
            finished = finish(trainer)
            if cfg.distill.enabled and cfg.distill.test_teacher:  # stage 3: the teacher beside the student
                distill_report.score_teacher(trainer, finished["reports"], export_ctranslate2)
        distributed.wait_for_rank0()  # the other ranks wait for the test reports, then all leave together
        trainer.metrics.close()
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        remove_if_unused(Path(HydraConfig.get().runtime.output_dir))  # a failed start leaves no stray run dir
        sys.exit(2)
    finally:
        distributed.shutdown()


if __name__ == "__main__":
    main()
