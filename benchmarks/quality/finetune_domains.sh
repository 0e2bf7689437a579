#!/usr/bin/env bash
# Measurement: what fine-tuning a trained En->De model buys on real domains, against training from
# scratch in the same minutes, and what it costs on the parent's own domain (Multi30k).
#
#   PARENT=runs/en_de_parent bash benchmarks/quality/finetune_domains.sh            # all domains, 10-minute runs
#   PARENT=... DOMAINS=opus_emea_de_en MINUTES=1 OUT=/tmp/ft bash benchmarks/quality/finetune_domains.sh   # a smoke run
#
# For each domain D of ../shared/data (OPUS samples: 500 training pairs held out as val; IWSLT TED: its val):
#   parent   the parent as it is, on D's test
#   a        the parent fine-tuned on D for MINUTES (+experiment=finetune)
#   b        the same with the parent's data mixed in (data.corpora, Multi30k at MIX_WEIGHT pairs per pair)
#   c        the recipe from scratch on D for MINUTES
#   d        (LONG_DOMAINS only) the recipe from scratch on D for PARENT_MINUTES + MINUTES
# Each run scores D's test; a and b also Multi30k's test_2016_flickr (their `parent.*` report), c, d and the parent
# are scored there by translate.py. Then mt.compare: a against parent, c and d on D; a and b against the parent on
# Multi30k. Runs go one after the other (each with the machine alone); outputs in OUT, nothing in the repository.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
PARENT=${PARENT:?set PARENT to the run dir of the En->De recipe (python train.py +experiment=multi30k_en_de)}
DATA=${DATA:-$ROOT/../shared/data}
OUT=${OUT:-runs/finetune}
MINUTES=${MINUTES:-10}
PARENT_MINUTES=${PARENT_MINUTES:-56}
MIX_WEIGHT=${MIX_WEIGHT:-0.3}  # chosen on EMEA val with MIX_LR (docs/experiments/finetune.md, "mixing ... at a lower rate")
MIX_LR=${MIX_LR:-1e-3}         # (b)'s learning rate
RUNS=${RUNS:-a b c d}          # which of the runs below to train now (a later call adds the rest)
DOMAINS=${DOMAINS:-opus_emea_de_en opus_jrc_acquis_de_en opus_kde4_de_en opus_ted2020_de_en iwslt_ted_de_en}
LONG_DOMAINS=${LONG_DOMAINS:-opus_emea_de_en iwslt_ted_de_en}
SRC=${SRC:-en} TGT=${TGT:-de}
M30K=$DATA/multi30k
mkdir -p "$OUT"

common() {  # the data arguments of domain $1
    local dir=$DATA/$1
    echo "data=local data.dir=$dir data.src_lang=$SRC data.tgt_lang=$TGT data.test_splits=[test]"
    if [ -f "$dir/val.$SRC.gz" ]; then echo "data.valid_split=val"; else echo "data.valid_from_train=500"; fi
}

score() {  # score CHECKPOINT INPUT REFS DIR: translate.py's report into DIR
    mkdir -p "$4"
    python translate.py checkpoint="$1" input="$2" output="$4/hyp" references="$3" report_dir="$4" device=cpu \
        > /dev/null 2> "$4/translate.log"
}

for d in $DOMAINS; do
    dir=$DATA/$d
    [ -f "$dir/test.$SRC.gz" ] || { echo "error: $dir/test.$SRC.gz: no such file" >&2; exit 2; }
    # shellcheck disable=SC2046
    set -- $(common "$d")
    [ -f "$OUT/$d.parent/hyp" ] || score "$PARENT" "$dir/test.$SRC.gz" "$dir/test.$TGT.gz" "$OUT/$d.parent"
    want() { [[ " $RUNS " == *" $1 "* ]] && [ ! -f "$OUT/$d.$1/test.hyp" ]; }
    ! want a || python train.py +experiment=finetune "$@" train.init_from="$PARENT" \
        train.max_time="$MINUTES" train.progress=false run_dir="$OUT/$d.a"
    ! want b || python train.py +experiment=finetune "$@" train.init_from="$PARENT" train.lr="$MIX_LR" \
        "data.corpora=[{dir: '$dir'}, {dir: '$M30K', weight: $MIX_WEIGHT}]" \
        train.max_time="$MINUTES" train.progress=false run_dir="$OUT/$d.b"
    ! want c || python train.py +experiment=multi30k_en_de "$@" train.max_time="$MINUTES" \
        train.progress=false run_dir="$OUT/$d.c"
    if [[ " $LONG_DOMAINS " == *" $d "* ]] && want d; then
        python train.py +experiment=multi30k_en_de "$@" train.max_time=$((PARENT_MINUTES + MINUTES)) \
            train.progress=false run_dir="$OUT/$d.d"
    fi
    # Reports over the runs that exist so far (a later call with other RUNS completes them)
    runs=() hyps=("$OUT/$d.parent/hyp") mruns=(parent) mhyps=("$PARENT/test_2016_flickr.hyp")
    for r in a b c d; do
        [ -f "$OUT/$d.$r/test.hyp" ] || continue
        runs+=("$r") hyps+=("$OUT/$d.$r/test.hyp")
        if [ "$r" = a ] || [ "$r" = b ]; then  # fine-tuned runs report Multi30k themselves (parent.*)
            m="$OUT/$d.$r/parent.test_2016_flickr.hyp"
        else
            m="$OUT/$d.$r.m30k/hyp"
            [ -f "$m" ] || score "$OUT/$d.$r" "$M30K/test_2016_flickr.$SRC.gz" "$M30K/test_2016_flickr.$TGT.gz" \
                "$OUT/$d.$r.m30k"
        fi
        mruns+=("$r") mhyps+=("$m")
    done
    [ ${#runs[@]} -gt 0 ] || continue
    python -m mt.compare "${hyps[@]}" --refs "$dir/test.$TGT.gz" --names "$(IFS=,; echo "parent,${runs[*]}")" \
        --json "$OUT/$d.compare.json" | tee "$OUT/$d.compare.md"
    python -m mt.compare "${mhyps[@]}" --refs "$M30K/test_2016_flickr.$TGT.gz" --names "$(IFS=,; echo "${mruns[*]}")" \
        --json "$OUT/$d.forgetting.json" | tee "$OUT/$d.forgetting.md"
done
