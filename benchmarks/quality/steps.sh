# shellcheck shell=bash
# Sourced by the measurement scripts whose steps are runs of train.py.
# step RUN_DIR ARGS...: `python train.py ARGS... run_dir=RUN_DIR` unless RUN_DIR holds a finished run (an interrupted
# one resumes: the same command), its log appended to RUN_DIR.log.
step() {
    local run=$1
    shift
    if [ -f "$run/checkpoint_final.pt" ]; then
        echo "$(date +%T) $run: done"
        return
    fi
    echo "$(date +%T) $run: python train.py $*"
    python train.py "$@" train.progress=false run_dir="$run" 2>>"$run.log"
    echo "$(date +%T) $run: finished"
}
