"""Train a Transformer translator: `python train.py [+experiment=NAME] [group=option] [key=value ...]`.

Data -> BPE -> model -> teacher-forced training with validation -> best/averaged checkpoint -> test report.
Multi-GPU or multi-process CPU: `torchrun --nproc_per_node=N train.py ...`.
"""

import logging
import os
import sys
import time
from pathlib import Path

import datasets
import hydra
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from mt.config import register_configs, to_dataclass
from mt.errors import USER_ERRORS
from mt.training import Trainer, finish, keep_freed_memory_in_the_heap, prepare_data, restore_signal_handlers

log = logging.getLogger("train")
register_configs()


def init_distributed() -> int:
    """Join the torchrun process group if there is one; returns this process's rank."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0
    import torch

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend)
    return dist.get_rank()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(dcfg: DictConfig) -> None:
    job_start = time.time()
    keep_freed_memory_in_the_heap()
    try:
        cfg = to_dataclass(dcfg)
        if not cfg.train.progress:  # no bars at all, also none from `datasets` while it reads and maps the corpus
            datasets.disable_progress_bars()
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        rank = init_distributed()
        if rank == 0:
            (run_dir / "config.resolved.yaml").write_text(OmegaConf.to_yaml(dcfg, resolve=True))
        else:
            logging.getLogger().setLevel(logging.WARNING)
        # Rank 0 trains the tokenizer and fills the datasets cache; the others then reuse both.
        if rank != 0:
            dist.barrier()
        corpus = prepare_data(cfg, run_dir, cfg.model.max_positions)
        if rank == 0 and dist.is_initialized():
            dist.barrier()
        trainer = Trainer(cfg, corpus, run_dir)
        reason = trainer.fit(job_start)
        restore_signal_handlers()
        if reason in ("SIGINT", "SIGTERM"):
            log.warning("interrupted (%s) at update %d; checkpoint saved in %s; run the same command to resume",
                        reason, trainer.update, run_dir)  # fmt: skip
            sys.exit(130 if reason == "SIGINT" else 143)
        log.info("training stopped (%s) after %d updates, %.1f min", reason, trainer.update, trainer.elapsed / 60)
        if rank == 0:
            finish(trainer)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
