#!/usr/bin/env bash
# Measurement: sequence-level distillation on Multi30k En->De (docs/distill.md). Each step is one run of
# train.py; a step whose run finished is skipped, an interrupted one resumes (the same command), so the script
# may be stopped and called again, over several sessions.
#
#   OUT=runs/distill_m30k bash benchmarks/quality/distill_multi30k.sh teachers        # 3 x ~56 min
#   OUT=runs/distill_m30k bash benchmarks/quality/distill_multi30k.sh fill            # the ensemble translates train
#   OUT=runs/distill_m30k SEEDS="1 2" bash benchmarks/quality/distill_multi30k.sh students baselines  # 56 min each
#
# teachers   the 56-minute recipe (+experiment=multi30k_en_de), seeds 1-3, each held to the updates the recipe
#            made in 56 minutes on an AMD EPYC Zen 4 (8,254: benchmarks/RESULTS.md), not to a clock, so that a
#            teacher is the same model however busy the machine was while it trained
# fill       the three teachers as one ensemble translate Multi30k's training sources into the cache every student
#            reads (a one-update throwaway run), so that no student's 56 minutes pay for it
# students   +experiment=distill with the ensemble as the teacher, 56 minutes, seeds SEEDS (distill.mix=MIX)
# baselines  the same preset and shape on the original pairs alone (distill.enabled=false), 56 minutes, SEEDS
# Students and baselines are time-budgeted: run them with the machine alone. With UPDATES="N1 N2" (one a seed) they
# are held to that many updates instead (the same runs, whatever else shares the machine); SHAPE gives the student's
# model.* keys (the plan's probe would time a shared machine); TEACHERS another teacher (a run dir or [A,B]).
# Outputs in OUT, nothing in the repository.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-runs/distill_m30k}
SEEDS=${SEEDS:-1 2}
MIX=${MIX:-both}
MINUTES=${MINUTES:-56}
TEACHER_UPDATES=${TEACHER_UPDATES:-8254}
CACHE=$OUT/teacher_translations
mkdir -p "$OUT"
TEACHERS=${TEACHERS:-[$OUT/teacher_s1,$OUT/teacher_s2,$OUT/teacher_s3]}
UPDATES=${UPDATES:-}
SHAPE=${SHAPE:-}

budget() {  # budget SEED: the train.* keys that end seed SEED's student or baseline
    if [ -z "$UPDATES" ]; then
        echo "train.max_time=$MINUTES"
        return
    fi
    local i=0 seed
    for seed in $SEEDS; do
        i=$((i + 1))
        if [ "$seed" = "$1" ]; then echo "train.max_time=0 train.max_updates=$(echo "$UPDATES" | cut -d' ' -f$i)"; fi
    done
}

# shellcheck source=benchmarks/quality/steps.sh
source "$ROOT/benchmarks/quality/steps.sh"

for stage in "$@"; do
    case $stage in
    teachers)
        for seed in 1 2 3; do
            step "$OUT/teacher_s$seed" +experiment=multi30k_en_de train.seed="$seed" train.max_time=0 \
                train.max_updates="$TEACHER_UPDATES"
        done
        ;;
    fill)
        step "$OUT/fill" +experiment=distill distill.teacher="$TEACHERS" distill.cache_dir="$CACHE" \
            distill.test_teacher=false distill.min_speedup=0 data=multi30k train.max_time=0 train.max_updates=1
        ;;
    students)
        for seed in $SEEDS; do
            # shellcheck disable=SC2046,SC2086
            step "$OUT/student_${MIX}_s$seed" +experiment=distill distill.teacher="$TEACHERS" \
                distill.cache_dir="$CACHE" distill.mix="$MIX" data=multi30k train.seed="$seed" $(budget "$seed") $SHAPE
        done
        ;;
    baselines)
        for seed in $SEEDS; do
            # shellcheck disable=SC2046,SC2086
            step "$OUT/baseline_s$seed" +experiment=distill distill.enabled=false data=multi30k \
                train.seed="$seed" $(budget "$seed") $SHAPE
        done
        ;;
    *)
        echo "unknown stage $stage (teachers, fill, students, baselines)" >&2
        exit 2
        ;;
    esac
done
