#!/usr/bin/env bash
# Trials: changes to the En->De recipe (conf/experiment/multi30k_en_de.yaml), each a 56-minute run with
# the machine alone, chosen on the whole val set (1,014 sentences; never test), then the finalist against the
# recipe with several seeds. The walk: `replica` (fairseq's recipe mirrored,
# conf/experiment/multi30k_en_de_fairseq.yaml) and the r_* trials, each one change from it toward this project's
# recipe (r_xavier: this project's initialization; the replica has fairseq's).
#
#   bash benchmarks/quality/recipe_trials.sh base big              # train what is missing, then the val table
#   SEEDS="1 2 3" bash benchmarks/quality/recipe_trials.sh base big_d3   # the 3-seed confirmation
#   bash benchmarks/quality/recipe_trials.sh replica r_cased r_prenorm   # the walk, against the replica
#   WARMUP=500 bash benchmarks/quality/recipe_trials.sh replica r_cased   # the warmup fairseq's run.sh computed on
#                                     # this host (its log: "updates, warmup N"), for replica and r_* trials
#   MINUTES=3 OUT=/tmp/trials bash benchmarks/quality/recipe_trials.sh base   # a smoke run
#   PAIR=de-en SEEDS=2 bash benchmarks/quality/recipe_trials.sh base r_combo_const   # De->En: its recipe
#                                     # (multi30k_de_en), the replica's family turned round; runs NAME.de-en.sSEED
#   DEVICE=cuda JOBS=6 UPDATES=3500 MINUTES=6 SEEDS="1 2" DATA=.gpudata \
#       bash benchmarks/quality/recipe_trials.sh replica r_prenorm r_d02   # the walk at a fixed update count on
#                                     # a GPU, six small runs at once (each stops at UPDATES or MINUTES)
#
# A trial is a name and its overrides (below). Every run is scored on the whole val set by translate.py (the
# run's own model: averaged or EMA, as it translates), and mt.compare puts all the named runs of the first seed
# side by side against the first name, with paired-bootstrap p-values (sacreBLEU's, 1,000 resamples). Outputs in
# OUT (run dirs NAME.sSEED, val hypotheses, the table as val.md / val.json); nothing in the repository. avg10 is
# not a run: averaging changes no update, so it averages the last 10 epoch checkpoints that base keeps (an 8-run
# budget then has room for one more hypothesis); likewise r_avg5 averages the replica's last 5, and r_gnmt decodes
# the replica's model with this project's GNMT length penalty (1.5) instead of fairseq's lenpen 0.8.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
DATA=${DATA:-$ROOT/../shared/data}
OUT=${OUT:-runs/trials}
MINUTES=${MINUTES:-56}
SEEDS=${SEEDS:-1}
WARMUP=${WARMUP:-}  # replica and r_*: run.sh's warmup on this host, unless the trial sets its own (r_const)
UPDATES=${UPDATES:-}  # stop each run at this many updates too (a GPU's walk at the CPU hour's update count)
DEVICE=${DEVICE:-cpu}  # where the runs train and decode
JOBS=${JOBS:-1}  # runs trained at once, each logging to OUT/NAME.sSEED.log (a GPU has room for several small ones)
PAIR=${PAIR:-en-de}  # the direction: en-de (the recipe trials and the walk) or de-en (its runs are NAME.de-en.sSEED)
M30K=$DATA/multi30k
case $PAIR in
    en-de) SRC=en TGT=de TAG="" ;;
    de-en) SRC=de TGT=en TAG=".de-en" ;;  # a run of the other direction is never taken for a finished one
    *) echo "error: PAIR=$PAIR: give en-de or de-en" >&2; exit 2 ;;
esac

overrides() {  # the overrides of trial $1 (one hypothesis each; results go to docs/experiments/recipes.md)
    case $1 in
        base) echo "train.keep_last=10" ;;  # the recipe as it is (10 epoch checkpoints kept on disk, for avg10)
        big) echo "train.accumulate=3 train.lr=4e-3 train.warmup=150" ;;  # ~7.5k-token updates, twice the peak lr
        big_d3) echo "train.accumulate=3 train.lr=4e-3 train.warmup=150 model.dropout=0.3" ;;
        avg10) echo "" ;;  # fairseq's last-10 average: not a run of its own, base's last 10 epochs averaged
        ema) echo "train.ema_decay=0.999 train.average_last=0" ;;     # EMA instead of the last-5 average
        rdrop) echo "train.rdrop_alpha=3" ;;                          # R-Drop (2x compute per update)
        wdrop) echo "train.tgt_word_dropout=0.1" ;;                   # target-side word dropout
        lower) echo "tokenizer.normalization=NFC+Lowercase" ;;        # trained lowercased, as fairseq's recipe
        finit) echo "model.init=fairseq" ;;  # fairseq's initialization, the implementation finding
        const) echo "train.schedule=constant" ;;  # De->En's trial of En->De's schedule: both recipes have it now
        # the walk: fairseq's recipe mirrored, then one change at a time toward this project's
        replica) echo "" ;;
        r_xavier) echo "model.init=xavier" ;;                         # this project's initialization
        r_cased) echo "tokenizer.normalization=NFC" ;;                # cased text, what users read
        r_prenorm) echo "model.norm=pre" ;;
        r_ffn512) echo "model.d_ff=512" ;;
        r_d02) echo "model.dropout=0.2" ;;
        r_hfbpe) echo "tokenizer.pretokenize=none" ;;                 # the HF BPE on raw text (no Moses)
        r_const) echo "train.max_tokens=2500 train.accumulate=1 train.schedule=constant train.lr=2e-3" \
            "train.warmup=400 train.cooldown=0.2" ;;  # the recipe's 2.5k-token updates and constant schedule
        r_combo) echo "tokenizer.normalization=NFC tokenizer.pretokenize=none" \
            "decode.length_penalty_type=gnmt decode.length_penalty=1.5" ;;  # the walk's kept steps together
        r_combo_const) echo "$(overrides r_combo) $(overrides r_const)" ;;      # and the 2.5k-token updates
        # levers past the walk, on r_combo at the replica's 8k-token updates (per-token cost the same or lower, so
        # a tie at equal updates is no loss in the hour): a deep encoder with a shallow decoder, dropout inside the
        # attention and the FFN too, the peak lr up or down, label smoothing 0.2, twice the warmup
        r_combo_6x2) echo "$(overrides r_combo) model.encoder_layers=6 model.decoder_layers=2" ;;
        r_combo_adrop) echo "$(overrides r_combo) model.attention_dropout=0.1 model.activation_dropout=0.1" ;;
        r_combo_lr7) echo "$(overrides r_combo) train.lr=7e-3" ;;
        r_combo_lr35) echo "$(overrides r_combo) train.lr=3.5e-3" ;;
        r_combo_ls2) echo "$(overrides r_combo) train.label_smoothing=0.2" ;;
        r_combo_wu12) echo "$(overrides r_combo) train.warmup=1200" ;;
        r_avg5 | r_gnmt) echo "" ;;  # not runs of their own: the replica's checkpoints, averaged or decoded otherwise
        *) echo "error: unknown trial '$1' (see overrides() in $0)" >&2; return 2 ;;
    esac
}

experiment() {  # the recipe a trial changes: the replica for replica and r_*, else the pair's recipe
    case $1 in replica | r_*) echo multi30k_en_de_fairseq ;; *) echo "multi30k_${SRC}_$TGT" ;; esac
}
direction() {  # the replica's config is En->De's: turned round for PAIR=de-en (the pair's own recipes need nothing)
    if [ "$PAIR" = de-en ] && [ "$(experiment "$1")" = multi30k_en_de_fairseq ]; then
        echo "data.src_lang=de data.tgt_lang=en"
    fi
}
rundir() {  # the run directory of trial $1, seed $2
    echo "$OUT/$1$TAG.s$2"
}
host_warmup() {  # train.warmup=$WARMUP for a replica-family trial that does not set its own warmup
    if [ -n "$WARMUP" ] && [ "$(experiment "$1")" = multi30k_en_de_fairseq ] \
        && [[ "$(overrides "$1")" != *train.warmup=* ]]; then echo "train.warmup=$WARMUP"; fi
}

[ $# -gt 0 ] || { echo "usage: bash $0 TRIAL... (base big big_d3 avg10 ema rdrop wdrop lower finit;" \
    "replica r_xavier r_cased r_prenorm r_ffn512 r_d02 r_hfbpe r_const r_avg5 r_gnmt r_combo r_combo_const" \
    "r_combo_6x2 r_combo_adrop r_combo_lr7 r_combo_lr35 r_combo_ls2 r_combo_wu12; PAIR=en-de or de-en)" >&2; exit 2; }
for t in "$@"; do overrides "$t" > /dev/null; done  # every name known before anything runs
for t in "$@"; do  # both recipes have the constant schedule (De->En since 2026-11-28): const would train base again
    [ "$t" != const ] || {
        echo "error: const is base now (both recipes train with the constant schedule since 2026-11-28)" >&2
        exit 2
    }
done
[[ $JOBS =~ ^[1-9][0-9]*$ ]] || {
    echo "error: JOBS=$JOBS: give the number of runs to train at once (1 or more)" >&2; exit 2; }
[[ -z $UPDATES || $UPDATES =~ ^[1-9][0-9]*$ ]] || {
    echo "error: UPDATES=$UPDATES: give a number of updates (1 or more), or leave MINUTES alone to stop runs" >&2
    exit 2; }
mkdir -p "$OUT"
derived() {  # avg10, r_avg5, r_gnmt: decodings of another trial's run, not runs of their own
    case $1 in avg10 | r_avg5 | r_gnmt) return 0 ;; *) return 1 ;; esac
}
train_run() {  # train trial $1 with seed $2 (unless its run is complete), then decode val with its model
    local t=$1 seed=$2 run extra=(train.device="$DEVICE" data.dir="$M30K")
    run=$(rundir "$t" "$seed")
    [ -z "$UPDATES" ] || extra+=(train.max_updates="$UPDATES")
    [ "$JOBS" = 1 ] || extra+=(data.cache_dir="$run.cache")  # runs at once never write one cache
    if [ ! -f "$run/test_2016_flickr.hyp" ]; then
        # shellcheck disable=SC2046
        python train.py +experiment="$(experiment "$t")" $(overrides "$t") $(direction "$t") $(host_warmup "$t") \
            train.seed="$seed" train.max_time="$MINUTES" train.progress=false run_dir="$run" "${extra[@]}"
    fi
    [ -f "$run/val.hyp" ] || python translate.py checkpoint="$run" input="$M30K/val.$SRC.gz" output="$run/val.hyp" \
        device="$DEVICE" > /dev/null 2> "$run/val.translate.log"
}

pids=()
for seed in $SEEDS; do  # the trained runs, JOBS at a time
    for t in "$@"; do
        derived "$t" && continue
        if [ "$JOBS" = 1 ]; then train_run "$t" "$seed"; continue; fi
        while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
        train_run "$t" "$seed" > "$(rundir "$t" "$seed").log" 2>&1 &
        pids+=($!)
    done
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=$((failed + 1)); done
[ "$failed" = 0 ] || { echo "error: $failed of ${#pids[@]} runs failed: see $OUT/*.log" >&2; exit 1; }
for seed in $SEEDS; do  # then the decodings of those runs
    for t in "$@"; do
        derived "$t" || continue
        run=$(rundir "$t" "$seed") base=$(rundir base "$seed")
        if [ "$t" = avg10 ]; then  # training is the same as base's: average its last 10 epoch checkpoints
            [ -f "$base/test_2016_flickr.hyp" ] || {
                echo "error: avg10 averages base's run: name base too (bash $0 base avg10)" >&2; exit 2; }
            mkdir -p "$run"
            [ -f "$run/val.hyp" ] || {
                python -m mt.checkpoint "$base" --average-last 10 --output "$base/checkpoint_avg10.pt"
                python translate.py checkpoint="$base/checkpoint_avg10.pt" input="$M30K/val.$SRC.gz" \
                    output="$run/val.hyp" device="$DEVICE" > /dev/null 2> "$run/val.translate.log"; }
            continue
        fi
        replica=$(rundir replica "$seed")  # r_avg5, r_gnmt: the replica's run, averaged or decoded otherwise
        [ -f "$replica/test_2016_flickr.hyp" ] || {
            echo "error: $t reuses the replica's run: name replica too (bash $0 replica $t)" >&2; exit 2; }
        mkdir -p "$run"
        if [ "$t" = r_avg5 ]; then
            ckpt=$replica/checkpoint_avg5.pt decode=()
            [ -f "$ckpt" ] || python -m mt.checkpoint "$replica" --average-last 5 --output "$ckpt"
        else
            ckpt=$replica decode=(decode.length_penalty_type=gnmt decode.length_penalty=1.5)
        fi
        [ -f "$run/val.hyp" ] || python translate.py checkpoint="$ckpt" "${decode[@]}" input="$M30K/val.$SRC.gz" \
            output="$run/val.hyp" device="$DEVICE" > /dev/null 2> "$run/val.translate.log"
    done
done
first=$(set -- $SEEDS; echo "$1")
if [ $# -lt 2 ]; then  # one trial (a seed of a rematch pair): its val hypotheses are written, there is no table
    echo "$1: val hypotheses in $OUT/$1$TAG.s*/val.hyp (name two trials or more for the val table against the first)"
    exit 0
fi
hyps=() names=()
for t in "$@"; do hyps+=("$(rundir "$t" "$first")/val.hyp") names+=("$t"); done
python -m mt.compare "${hyps[@]}" --refs "$M30K/val.$TGT.gz" --names "$(IFS=,; echo "${names[*]}")" \
    --json "$OUT/val$TAG.s$first.json" | tee "$OUT/val$TAG.s$first.md"
