#!/usr/bin/env bash
# One GPU session's work in one command (docs/gpu.md).
#
#   bash benchmarks/gpu_kit.sh prepare          # here, on the CPU machine (needs the package index)
#   bash benchmarks/gpu_kit.sh run [OUT_DIR]    # there, on the GPU machine (no network): tests, recipe, benchmarks
#   bash benchmarks/gpu_kit.sh run OUT --device cpu --minutes 1 --smoke   # a dry run of the same steps on a CPU
#
# `prepare` downloads the wheels the GPU image lacks into .whl/ and copies Multi30k into .gpudata/ (both
# git-ignored, both to be named in the device tool's `carry`). `run` installs the wheels into its own folder, then runs,
# most important first: `pytest -m gpu`, the GPU recipe for --minutes of training, its checkpoint's beam-5 BLEU on
# test_2016_flickr decoded on the GPU (fp32/TF32 and bf16) and on the CPU, decoding speed, the training throughput
# benchmark (small and base shapes) and torchrun on one GPU, writing eight files at most (the device tool brings
# back eight) to OUT_DIR (default $OUT, else ./gpu_out); summary.txt has the lines that matter. Every step runs even
# when one before it failed (a GPU's minutes are few); each failure is named in summary.txt, and the kit then exits 1.
# What a run writes besides OUT_DIR goes to a folder of its own (mktemp), never to files an earlier run left.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
shift || true

if [ "$mode" = prepare ]; then
    set -e
    rm -rf .whl && mkdir -p .whl .gpudata/multi30k
    # What the GPU image (Python 3.12) lacks: hydra and its parser runtime, datasets and two of its needs, sacremoses
    # (tokenizer.pretokenize=moses; regex, click and joblib, its needs, are there). The image has transformers (the
    # HF Marian peer of benchmarks/peers/train_peers.py), tokenizers, sacrebleu, pytest.
    python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl hydra-core==1.3.2 omegaconf==2.3.0 datasets dill multiprocess sacremoses
    # omegaconf's parser runtime is published as a source archive only: build its (pure Python) wheel here.
    python -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3
    cp ../shared/data/multi30k/{train,val,test_2016_flickr}.{en,de}.gz .gpudata/multi30k/
    du -sh .whl .gpudata
    exit 0
fi
if [ "$mode" != run ]; then
    echo "usage: bash benchmarks/gpu_kit.sh prepare | run [OUT_DIR] [--device cpu] [--minutes N] [--smoke]" >&2
    exit 2
fi

out=${OUT:-gpu_out}
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then out=$1; shift; fi
device=cuda
minutes=2.5
smoke=0  # --smoke: tiny model, 100 test lines, small benchmark batches: checks the plumbing, measures nothing
while [ $# -gt 0 ]; do
    case $1 in
        --device) device=$2; shift 2 ;;
        --minutes) minutes=$2; shift 2 ;;
        --smoke) smoke=1; shift ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
# The data the GPU machine reads comes with the working tree (.gpudata, from prepare): without it the recipe and the
# decoding steps would fail after the tests had spent GPU minutes.
for f in .gpudata/multi30k/{train,val,test_2016_flickr}.{en,de}.gz; do
    [ -f "$f" ] || { echo "error: $f not found: run bash benchmarks/gpu_kit.sh prepare first" >&2; exit 2; }
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
summary=$out/summary.txt
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_kit.XXXXXX")  # this run's own: checkpoints, hypotheses, decode logs
failed=()
must() {  # NAME COMMAND...: runs it; a failure is written to the summary and fails the kit at its end
    local name=$1 rc
    shift
    "$@"
    rc=$?
    if [ $rc -ne 0 ]; then
        failed+=("$name")
        echo "FAILED: $name (exit $rc)" | tee -a "$summary" >&2
    fi
    return $rc
}
export PYTHONUNBUFFERED=1
# Where the image names its interpreter python3 only, `python` runs it.
if ! command -v python >/dev/null; then
    # A wrapper, not a symlink: a venv's interpreter linked from elsewhere no longer finds its venv (nor its torch).
    mkdir -p "$work/pybin" && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > "$work/pybin/python"
    chmod +x "$work/pybin/python" && export PATH=$work/pybin:$PATH
fi
if ls .whl/*.whl >/dev/null 2>&1 && ! python -c "import hydra, datasets" 2>/dev/null; then
    must "install the wheels" python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$work/site" .whl/*.whl
    export PYTHONPATH=$work/site${PYTHONPATH:+:$PYTHONPATH}
fi
step() { echo "== $* ($(date -u +%T))" | tee -a "$summary"; }

{
    date -u
    python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
        torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv 2>/dev/null || true
    lscpu | grep -E "^Model name|^CPU\(s\)" || true
} | tee "$summary"

step "pytest -m gpu tests/test_gpu.py"
must "pytest -m gpu" timeout 150 python -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_gpu.py \
    > "$out/pytest_gpu.log" 2>&1
tail -4 "$out/pytest_gpu.log" | tee -a "$summary"

step "recipe: multi30k_en_de_gpu, $minutes min on $device"
run_dir=$work/recipe
test_input=.gpudata/multi30k/test_2016_flickr.en.gz
shapes="small base"
peer_args="--dtypes bf16 --tokens 25000 --steps 10"
extra=()
if [ $smoke = 1 ]; then
    extra=(model=transformer_tiny train.valid_every=50 train.precision=fp32)
    python -c "import gzip, sys; sys.stdout.writelines(gzip.open(sys.argv[1], 'rt').readlines()[:100])" \
        $test_input > "$work/test100.en"
    test_input=$work/test100.en
    shapes=small
    peer_args="--dtypes fp32 --tokens 1000 --steps 2 --warmup 1"
fi
must recipe python train.py +experiment=multi30k_en_de_gpu train.device="$device" train.max_time="$minutes" \
    train.progress=false run_dir="$run_dir" "${extra[@]}" > "$out/recipe.log" 2>&1
grep -E "test_2016|stopped|updates/s|tok/s" "$out/recipe.log" | tail -4 | tee -a "$summary"
cp $run_dir/metrics.jsonl "$out/" 2>/dev/null

# The same checkpoint decoded on the GPU (fp32, whose matmuls run in TF32, and bf16 autocast) and on the CPU (fp32):
# BLEU of each against the reference, and how many lines the GPU decodings share with the CPU's.
step "beam-5 BLEU of the recipe's checkpoint, GPU and CPU"
decode_log=$out/decode.log
: > "$decode_log"
translate() {  # NAME then translate.py overrides; the hypotheses go to $work/hyp.NAME
    local name=$1 rc; shift
    must "translate $name" python translate.py checkpoint="$run_dir" input="$test_input" output="$work/hyp.$name" \
        "$@" > "$work/decode.$name" 2>&1
    rc=$?
    { echo "-- $name: $*"; cat "$work/decode.$name"; } >> "$decode_log"
    grep -E "sentences/s|lowercased|rror" "$work/decode.$name" | sed "s/^.*INFO /$name: /" | tee -a "$summary"
    return $rc
}
refs=references=.gpudata/multi30k/test_2016_flickr.de.gz
[ $smoke = 1 ] && refs=references=$work/test100.de && python -c "import gzip, sys; \
    sys.stdout.writelines(gzip.open(sys.argv[1], 'rt').readlines()[:100])" \
    .gpudata/multi30k/test_2016_flickr.de.gz > "$work/test100.de"
decoded=1
translate gpu_fp32 device="$device" precision=fp32 decode.beam_size=5 decode.max_tokens=16000 "$refs" || decoded=0
translate gpu_bf16 device="$device" precision=bf16 decode.beam_size=5 decode.max_tokens=16000 "$refs" || decoded=0
translate cpu_fp32 device=cpu precision=fp32 decode.beam_size=5 decode.max_tokens=16000 "$refs" || decoded=0
# (compared only when all three decoded in this run)
[ $decoded = 1 ] && python - "$work/hyp.gpu_fp32" "$work/hyp.gpu_bf16" "$work/hyp.cpu_fp32" <<'PY' | tee -a "$summary"
import sys
gpu32, bf16, cpu = (open(f).read().splitlines() for f in sys.argv[1:])
for name, hyps in (("gpu fp32 (TF32)", gpu32), ("gpu bf16", bf16)):
    same = sum(a == b for a, b in zip(hyps, cpu))
    print(f"{name} vs cpu fp32: {same}/{len(cpu)} lines identical")
PY

step "decoding speed on $device"
for decode in "decode.beam_size=5" "decode=greedy"; do
    for tokens in 1500 16000; do  # ~64 sentences a batch, and a large token batch
        translate "speed_${decode##*=}_$tokens" device="$device" $decode decode.max_tokens=$tokens
    done
done

step "training throughput vs peers ($shapes)"
for shape in $shapes; do
    profile=; [ $shape = base ] && profile=--profile  # where the base step's GPU time goes
    must "train_peers $shape" python benchmarks/peers/train_peers.py --device "$device" --shape $shape $peer_args \
        $profile >> "$out/train_peers.log" 2>&1
    grep -A8 "^shape $shape" "$out/train_peers.log" | grep -E "^shape|^matmul|^this project|^HF|^torch" \
        | tee -a "$summary"
done

step "torchrun --nproc_per_node=1 (the launcher on one GPU) and a one-rank NCCL all_reduce"
nccl_backend=nccl
[ "$device" = cpu ] && nccl_backend=gloo
{
    must torchrun python -m torch.distributed.run --standalone --nproc_per_node=1 train.py \
        +experiment=multi30k_en_de_gpu model=transformer_tiny train.device="$device" train.max_updates=30 \
        train.max_time=0 train.valid_every=0 train.progress=false run_dir="$work/torchrun" > "$work/torchrun.log" 2>&1
    grep -E "device|process group|stopped|error" "$work/torchrun.log"
    cat > "$work/one_rank.py" <<PY
import torch, torch.distributed as d
d.init_process_group("$nccl_backend"); t = torch.ones(4, device="$device"); d.all_reduce(t)
print("all_reduce over", d.get_backend(), "on", t.device, "gives", t.tolist()); d.destroy_process_group()
PY
    must "all_reduce" python -m torch.distributed.run --standalone --nproc_per_node=1 "$work/one_rank.py" \
        > "$work/one_rank.log" 2>&1
    grep -v "^W" "$work/one_rank.log"
} > "$out/torchrun.log" 2>&1
tail -6 "$out/torchrun.log" | tee -a "$summary"
cp "$run_dir"/*.report.md "$out/" 2>/dev/null
date -u | tee -a "$summary"
if [ ${#failed[@]} -gt 0 ]; then
    echo "FAILED steps: ${failed[*]}" | tee -a "$summary" >&2
    exit 1
fi
