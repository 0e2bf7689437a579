"""The README.md of a release (`python -m mt.export release`): a model card in the Hugging Face format (YAML front
matter with languages, tags and metrics; then what the model is, how it was trained and scored, and how to use it),
written from the checkpoint and the test reports its run left beside it."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from mt.model.transformer import Transformer
from mt.train.records import hub_record, read_parent, run_files, test_reports

PARENT_SUFFIX = ".before"  # a fine-tuning run's report of its parent on the same split (mt/train/finish.py)


def task_languages(data: dict, report: dict) -> list[str]:
    """The languages of the direction a report scores: a multilingual run's report names it (`test.en-fr`)."""
    for direction in data.get("directions") or []:
        if report["name"].endswith(f".{direction}"):
            return direction.split("-")
    return [lang for lang in (data.get("src_lang"), data.get("tgt_lang")) if lang]


def training_command(run_dir: Path) -> str | None:
    """`python train.py` with the overrides Hydra recorded for the run."""
    overrides = run_dir / ".hydra" / "overrides.yaml"
    if not overrides.is_file():
        return None
    args = yaml.safe_load(overrides.read_text()) or []
    return " ".join(["python train.py", *[a for a in args if not a.startswith("run_dir=")]])


def front_matter(data: dict, reports: list[dict], name: str, library: str = "mt", license: str | None = None) -> dict:
    languages = [lang for lang in (data.get("src_lang"), data.get("tgt_lang")) if lang]
    for direction in data.get("directions") or []:
        languages += [lang for lang in direction.split("-") if lang not in languages]
    results = [
        {
            "task": {"type": "translation", "name": f"Translation {'-'.join(task_languages(data, r))}"},
            "dataset": {"name": data.get("name", "unknown"), "type": data.get("name", "unknown"), "split": r["name"]},
            "metrics": [
                {"type": "bleu", "value": r["bleu"], "name": "BLEU (sacreBLEU, cased)"},
                {"type": "bleu", "value": r["bleu_lowercase"], "name": "BLEU (sacreBLEU, lowercased)"},
                {"type": "chrf", "value": r["chrf"], "name": "chrF (sacreBLEU)"},
            ],
        }
        for r in reports
        if not r["name"].endswith(PARENT_SUFFIX)  # the parent's scores are not this model's results
    ]
    meta = {"language": languages, "tags": ["translation"], "metrics": ["bleu", "chrf"], "library_name": library}
    if library == "transformers":
        meta["pipeline_tag"] = "translation"
    if license:
        meta["license"] = license
    if results:
        meta["model-index"] = [{"name": name, "results": results}]
    return meta


def parent_lines(run_dir: Path) -> list[str]:
    """What a fine-tuning run started from (mt/train/finetune.py's record), with the parent's own test scores."""
    parent = read_parent(run_dir)
    if parent is None:
        return []
    scores = "; ".join(f"{s['split']} BLEU {s['bleu']:.2f}" for s in parent.get("test_scores", []) if "bleu" in s)
    return [f"- Fine-tuned from: `{parent['path']}` (weights digest {parent['weights_digest']})"
            + (f", whose test scores were: {scores}." if scores else ".")]  # fmt: skip


def licence_lines(license: str | None, hub: dict) -> list[str]:
    if license is None:
        return ["- Licence: not given at export; the training data's terms apply (set it with --license)."]
    if license == hub.get("license"):
        return [f"- Licence: {license}, the licence of `{hub['source']}`, which these weights derive from "
                "(--license sets another where its terms allow)."]  # fmt: skip
    return [f"- Licence: {license}."]


def origin(ckpt: dict, hub: dict, library: str) -> str:
    """The card's first sentence's end: how the weights were made."""
    where = "with the `mt` toolkit (its train.py, translate.py and serve.py load this directory)."
    if library != "mt":
        where = f"with the `mt` toolkit and exported for {library} (which loads this directory)."
    if not hub:
        return "trained from raw parallel text " + where
    tuned = read_parent(run_files(ckpt)) is not None
    return (f"`{hub['source']}` read from its transformers checkpoint" + (", fine-tuned on new data" if tuned else "")
            + " " + where)  # fmt: skip


def report_name(name: str) -> str:
    return f"{name} (the parent, before fine-tuning)" if name.endswith(PARENT_SUFFIX) else name


def model_card(
    ckpt: dict,
    model: Transformer,
    name: str,
    library: str = "mt",
    use: list[str] | None = None,
    license: str | None = None,
    exported: str | None = None,
) -> str:
    """The card's Markdown, front matter first. `library`, `use` (the "Use" section's lines) and `exported` (a line
    on how the files were made) for exports other than the release; `license`: the card's licence field."""
    config = ckpt.get("config") or {}
    data, decode, m = config.get("data", {}), config.get("decode", {}), model.cfg
    run_dir = run_files(ckpt)
    reports, command = test_reports(ckpt), training_command(run_dir)
    reports.sort(key=lambda r: r["name"].endswith(PARENT_SUFFIX))  # this model's own scores first
    hub = hub_record(ckpt)
    license = license or hub.get("license")  # an imported model carries its checkpoint's licence
    types = "types" if hub else "BPE types"
    directions = [d.replace("-", "->") for d in data.get("directions") or []]  # a multilingual run's
    pair = ", ".join(directions) or f"{data.get('src_lang', '?')}->{data.get('tgt_lang', '?')}"
    n_params = sum(p.numel() for p in model.parameters())
    lines = [
        "---",
        yaml.safe_dump(front_matter(data, reports, name, library, license), sort_keys=False).strip(),
        "---",
        "",
        f"# {name}: {pair} Transformer",
        "",
        f"A Transformer encoder-decoder (Vaswani et al. 2017) translating {pair}: {origin(ckpt, hub, library)}",
        "",
        "## Model",
        "",
        f"- {n_params:,} parameters: d_model {m.d_model}, {m.encoder_layers} encoder and {m.decoder_layers} decoder "
        f"layers, {m.n_heads} heads, feed-forward {m.d_ff}, {m.norm}-norm, {m.positions} positions (up to "
        f"{m.max_positions}), embeddings tied: {m.tie_embeddings}; vocabulary {model.src_vocab:,} / "
        f"{model.tgt_vocab:,} {types}.",
        "",
        "## Training",
        "",
        f"- Data: {data.get('name', 'unknown')} ({data.get('dir') or 'hub'}), {pair}.",
        f"- Command: `{command}`" if command else "- Command: not recorded with the checkpoint.",
        f"- Weights: {ckpt.get('chosen', 'the checkpoint exported')}.",
        *parent_lines(run_dir),
        *([f"- {exported}"] if exported else []),
        *([f"- From: `{hub['source']}` (transformers)."] if hub and read_parent(run_dir) is None else []),
        *licence_lines(license, hub),
        "",
        "## Evaluation",
        "",
    ]
    if reports:
        lines += ["| split | BLEU | BLEU lowercased | chrF |", "|---|---|---|---|"]
        lines += [
            f"| {report_name(r['name'])} | {r['bleu']:.2f} | {r['bleu_lowercase']:.2f} | {r['chrf']:.2f} |"
            for r in reports
        ]
        lines += ["", "sacreBLEU signatures:", ""]
        for r in reports:
            lines += [f"- {r['name']}: `{r['bleu_signature']}`, `{r['bleu_lowercase_signature']}`, "
                      f"`{r['chrf_signature']}`"]  # fmt: skip
        lines += ["", f"Decoded with: {json.dumps(reports[0].get('decode', decode))}."]
    else:
        lines.append("No test report scores these weights: train.py's reports score the run's checkpoint_final.pt "
                     "(export the run dir to publish them).")  # fmt: skip
    lines += ["", "## Use", ""]
    if use is not None:
        return "\n".join(lines + use)
    lines += [
        f"Decoding settings saved with the model: beam {decode.get('beam_size', '?')}, length penalty "
        f"{decode.get('length_penalty_type', 'gnmt')} {decode.get('length_penalty', '?')}.",
        "",
        "```bash",
        "echo 'A sentence to translate.' | python translate.py checkpoint=THIS_DIR",
        "python serve.py checkpoint=THIS_DIR port=8080          # HTTP API and a page to try it",
        "python -m mt.export ctranslate2 THIS_DIR ct2/          # for CTranslate2",
        "```",
        "",
        "```python",
        "from mt import Translator",
        'translator = Translator.load("THIS_DIR")',
        'print(translator.translate(["A sentence to translate."]))',
        "```",
        "",
        "The weights are safetensors and load without pickle.",
        "",
    ]
    return "\n".join(lines)
