#!/usr/bin/env bash
# Measurement: distillation on a second corpus (docs/distill.md), IWSLT TED De->En by default. Each step is one
# run of train.py; a step whose run finished is skipped, an interrupted one resumes, so the script may be stopped
# and called again, over several sessions.
#
#   OUT=runs/distill_iwslt bash benchmarks/quality/distill_pair.sh teacher fill     # the teacher, its translations
#   OUT=runs/distill_iwslt SEEDS="1 2" bash benchmarks/quality/distill_pair.sh students baselines compare
#
# teacher    the De->En recipe (+experiment=multi30k_de_en) on the corpus, held to TEACHER_UPDATES updates
# fill       the teacher translates the corpus's training sources into the cache the students read (a one-update
#            throwaway run), so that no student pays for it
# students   +experiment=distill with that teacher, seeds SEEDS, held to UPDATES updates, the student's shape SHAPE
# baselines  the same preset and shape on the original pairs alone (distill.enabled=false), the same updates
# compare    mt.compare on the test split: each student against its baseline, both seeds pooled, the teacher
# Runs are held to updates, not to a clock, so that two of them may share the machine (THREADS=1 each) and still
# be the runs the machine alone would make; the shape is given (the plan's probe would time a shared machine).
# Outputs in OUT, nothing in the repository.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-runs/distill_iwslt}
CORPUS=${CORPUS:-$ROOT/../shared/data/iwslt_ted_de_en}
SEEDS=${SEEDS:-1 2}
TEACHER_UPDATES=${TEACHER_UPDATES:-1600}
UPDATES=${UPDATES:-1000}
SHAPE=${SHAPE:-model.d_model=128 model.n_heads=4 model.d_ff=256 model.encoder_layers=6 model.decoder_layers=1}
THREADS=${THREADS:-2}
CACHE=$OUT/teacher_translations
DATA="data=local data.dir=$CORPUS data.src_lang=de data.tgt_lang=en data.valid_split=val data.test_splits=[test]"
mkdir -p "$OUT"
export OMP_NUM_THREADS=$THREADS

# shellcheck source=benchmarks/quality/steps.sh
source "$ROOT/benchmarks/quality/steps.sh"

pooled() {  # pooled NAME: both seeds' test outputs one after the other
    for seed in $SEEDS; do cat "$OUT/${1}_s$seed/test.hyp"; done > "$OUT/pooled_$1.hyp"
}

# shellcheck disable=SC2086
for stage in "$@"; do
    case $stage in
    teacher)
        step "$OUT/teacher" +experiment=multi30k_de_en $DATA train.seed=1 train.max_time=0 \
            train.max_updates="$TEACHER_UPDATES"
        ;;
    fill)
        step "$OUT/fill" +experiment=distill distill.teacher="$OUT/teacher" distill.cache_dir="$CACHE" \
            distill.test_teacher=false distill.min_speedup=0 $DATA $SHAPE train.max_time=0 train.max_updates=1
        ;;
    students)
        for seed in $SEEDS; do
            step "$OUT/student_s$seed" +experiment=distill distill.teacher="$OUT/teacher" distill.cache_dir="$CACHE" \
                $DATA $SHAPE train.seed="$seed" train.max_time=0 train.max_updates="$UPDATES"
        done
        ;;
    baselines)
        for seed in $SEEDS; do
            step "$OUT/baseline_s$seed" +experiment=distill distill.enabled=false $DATA $SHAPE train.seed="$seed" \
                train.max_time=0 train.max_updates="$UPDATES"
        done
        ;;
    compare)
        refs=$CORPUS/test.en.gz
        for seed in $SEEDS; do
            python -m mt.compare "$OUT/baseline_s$seed/test.hyp" "$OUT/student_s$seed/test.hyp" --refs "$refs" \
                --names baseline,student --json "$OUT/compare_s$seed.json"
        done
        pooled baseline
        pooled student
        for seed in $SEEDS; do zcat "$refs"; done > "$OUT/pooled_refs.txt"
        python -m mt.compare "$OUT/pooled_baseline.hyp" "$OUT/pooled_student.hyp" --refs "$OUT/pooled_refs.txt" \
            --names baseline,student --json "$OUT/compare_pooled.json"
        python -m mt.compare "$OUT/teacher/test.hyp" "$OUT/student_s1/test.hyp" --refs "$refs" \
            --names teacher,student --json "$OUT/compare_teacher.json"
        ;;
    *)
        echo "unknown stage $stage (teacher, fill, students, baselines, compare)" >&2
        exit 2
        ;;
    esac
done
