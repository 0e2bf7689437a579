#!/usr/bin/env bash
# One GPU session's work in one command (docs/gpu.md).
#
#   bash benchmarks/gpu_kit.sh prepare          # here, on the CPU machine (needs the package index)
#   bash benchmarks/gpu_kit.sh run [OUT_DIR]    # there, on the GPU machine (no network): tests, recipe, benchmarks
#   bash benchmarks/gpu_kit.sh run OUT --device cpu --minutes 1 --smoke   # a dry run of the same steps on a CPU
#
# `prepare` downloads the wheels the GPU image lacks into .whl/ and copies Multi30k into .gpudata/ (both
# git-ignored, both to be named in the device tool's `carry`). `run` installs the wheels into /tmp/site, then runs
# `pytest -m gpu`, the GPU recipe for --minutes of training, decoding speed on test_2016_flickr, and the training
# throughput benchmark, writing every log and report to OUT_DIR (default $OUT, else ./gpu_out).
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
shift || true

if [ "$mode" = prepare ]; then
    set -e
    rm -rf .whl && mkdir -p .whl .gpudata/multi30k
    # What the GPU image (Python 3.12) lacks: hydra and its parser runtime, datasets and two of its needs, and
    # transformers with what it needs beyond the image for the HF Marian peer of benchmarks/peers/train_peers.py.
    python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl hydra-core==1.3.2 omegaconf==2.3.0 datasets dill multiprocess \
        transformers huggingface-hub hf-xet regex safetensors tokenizers
    # omegaconf's parser runtime is published as a source archive only: build its (pure Python) wheel here.
    python -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3
    cp ../shared/data/multi30k/{train,val,test_2016_flickr}.{en,de}.gz .gpudata/multi30k/
    du -sh .whl .gpudata
    exit 0
fi
if [ "$mode" != run ]; then
    echo "usage: bash benchmarks/gpu_kit.sh prepare | run [OUT_DIR] [--device cpu] [--minutes N]" >&2
    exit 2
fi

out=${OUT:-gpu_out}
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then out=$1; shift; fi
device=cuda
minutes=8
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
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1 && ! python -c "import hydra, datasets, transformers" 2>/dev/null; then
    python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

{
    date -u
    python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
        torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv 2>/dev/null || true
} | tee "$out/machine.txt"

echo "== pytest -m gpu" | tee -a "$out/summary.txt"
python -m pytest -q -m gpu -p no:cacheprovider 2>&1 | tee "$out/pytest_gpu.log" | tail -3 | tee -a "$out/summary.txt"

echo "== recipe: multi30k_en_de_gpu, $minutes min on $device" | tee -a "$out/summary.txt"
run_dir=/tmp/gpu_recipe
test_input=.gpudata/multi30k/test_2016_flickr.en.gz
shapes="base big"
peer_args="--dtypes bf16 --tokens 25000 --steps 10 --profile"
extra=()
if [ $smoke = 1 ]; then
    extra=(model=transformer_tiny train.valid_every=50 train.precision=fp32)
    python -c "import gzip, sys; sys.stdout.writelines(gzip.open(sys.argv[1], 'rt').readlines()[:100])" \
        $test_input > /tmp/test100.en
    test_input=/tmp/test100.en
    shapes=small
    peer_args="--dtypes fp32 --tokens 1000 --steps 2 --warmup 1"
fi
rm -rf $run_dir
python train.py +experiment=multi30k_en_de_gpu train.device="$device" train.max_time="$minutes" \
    train.progress=false run_dir=$run_dir "${extra[@]}" 2>&1 | tee "$out/recipe.log" | grep -E "test_2016|stopped" \
    | tee -a "$out/summary.txt"
cp $run_dir/metrics.jsonl $run_dir/test_2016_flickr.report.md "$out/" 2>/dev/null

echo "== decoding test_2016_flickr on $device" | tee -a "$out/summary.txt"
for decode in "decode.beam_size=5" "decode=greedy"; do
    for tokens in 1500 16000; do  # ~64 sentences a batch, and a large token batch
        python translate.py checkpoint=$run_dir device="$device" input=$test_input \
            output=/tmp/hyp.de $decode decode.max_tokens=$tokens 2>&1 | grep "sentences/s" \
            | sed "s/^/$decode max_tokens=$tokens: /" | tee -a "$out/summary.txt"
    done
done

echo "== training throughput vs peers" | tee -a "$out/summary.txt"
for shape in $shapes; do
    python benchmarks/peers/train_peers.py --device "$device" --shape $shape $peer_args \
        2>&1 | tee "$out/train_peers_$shape.log" | tail -8 | tee -a "$out/summary.txt"
done
date -u | tee -a "$out/summary.txt"
