"""Train the bundled draft/target pair from scratch: `python -m training.train STAGE` (from the repository
root; the training tools are not part of the installed package — users get the trained weights).

Stages (each reads and writes a work directory, default `.train/`):

  data    collect the Python standard library's own source (present wherever Python is), hash the file
          list, train a byte-level BPE tokenizer with `tokenizers`, and tokenize the corpus to tokens.npy
  fit     train the Llama-architecture target on next-token prediction, then distill each draft
          candidate from the target's logits (the target's embeddings copied in, or projected onto the
          draft's width); saves Hugging Face directories (config.json + bf16 safetensors + tokenizer)
          and train_log.json. Runs on CUDA when available (that is how the bundled pair was made) and
          on the CPU otherwise.
  bundle  copy the chosen target and draft into the package (autospec/models/bundled/) and write the
          model card, including the properties measured on this machine (see training/card.py).

Only this module's `data` stage needs the project's own environment; `fit` imports nothing beyond
torch, numpy, tokenizers and transformers, so it runs on a bare GPU image.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import typer

app = typer.Typer(add_completion=False, help=__doc__.split("\n\n")[0])

EOS = "<|endoftext|>"
VOCAB_SIZE = 4096


@dataclass
class ModelConfig:
    """The knobs of one model in the pair (Llama architecture, head_dim 64 for vLLM)."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int


TARGET = ModelConfig("target", hidden_size=256, intermediate_size=768, num_layers=12, num_heads=4, num_kv_heads=2)
# Draft candidates; `bundle` keeps the one with the best measured speed-up. The narrow ones are cheap
# per token on a CPU (decode there is memory-bandwidth bound, so cost follows bytes of weights).
DRAFTS = [
    ModelConfig("draft-l2-d256", hidden_size=256, intermediate_size=768, num_layers=2, num_heads=4, num_kv_heads=2),
    ModelConfig("draft-l2-d128", hidden_size=128, intermediate_size=384, num_layers=2, num_heads=2, num_kv_heads=1),
]


@dataclass
class TrainSettings:
    seq_len: int = 1024
    batch_size: int = 32
    target_steps: int = 2000
    draft_steps: int = 4000
    lr: float = 1e-3
    draft_lr: float = 2e-3
    warmup: int = 100
    weight_decay: float = 0.1
    val_fraction: float = 0.01
    seed: int = 0
    extra: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------------------- data
def stdlib_files() -> list[Path]:
    """The standard library's .py files, sorted, without site-packages."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py") if "site-packages" not in p.parts and "dist-packages" not in p.parts]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def held_out_files(files: list[Path], token_counts: list[int], root: Path, val_fraction: float) -> dict:
    """The files whose every token lies in the validation tail that `fit` holds out.

    `fit` splits the concatenated token stream (files in `stdlib_files` order, each followed by EOS)
    into train and the last `val_fraction` of tokens. A file wholly inside that tail was never trained
    on, so its text can serve as prompts the pair has not memorised (autospec.workloads.stdlib_prompts).
    The one file straddling the boundary is named but not held out. Paths are relative to the stdlib
    root, module names dotted, each with the sha256 of the file that was split.
    """
    total = sum(token_counts)
    boundary = total - int(total * val_fraction)
    held, straddling, start = [], None, 0
    for path, count in zip(files, token_counts):
        if start >= boundary:
            rel = path.relative_to(root)
            module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
            held.append({"module": module, "path": rel.as_posix(),
                         "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
        elif start + count > boundary:
            straddling = path.relative_to(root).as_posix()
        start += count
    return {"split": f"the last {val_fraction:g} of the token stream (TrainSettings.val_fraction)",
            "tokens": total - boundary, "straddling_file": straddling, "files": held}


def corpus_held_out(tokenizer_file: Path, val_fraction: float = 0.01) -> dict:
    """Recompute `held_out_files` from this interpreter's stdlib and the pair's tokenizer.

    Valid only on the Python whose stdlib the pair was trained on (the card's file-list hash says which).
    """
    from tokenizers import Tokenizer

    root = Path(sysconfig.get_paths()["stdlib"])
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    used, texts = [], []
    for f in stdlib_files():
        try:
            texts.append(f.read_text(encoding="utf-8"))
            used.append(f)
        except UnicodeDecodeError:
            continue  # skipped by `data` too
    counts = [len(enc.ids) + 1 for enc in tokenizer.encode_batch(texts)]  # + the EOS `data` appends
    return held_out_files(used, counts, root, val_fraction)


def prompts_shared_with_training(held: dict, root: Path) -> list[str]:
    """Default prompts cut from held-out files whose text also stands in a training file (a docstring
    copied between modules, say): the ids `autospec.workloads.stdlib_prompts` must leave out."""
    from autospec.workloads.stdlib_prompts import definition_prompts

    held_paths = {entry["path"] for entry in held["files"]}
    training_text = "\0".join(f.read_text(encoding="utf-8", errors="replace") for f in stdlib_files()
                               if f.relative_to(root).as_posix() not in held_paths)
    shared = []
    for entry in held["files"]:
        source = (root / entry["path"]).read_text(encoding="utf-8")
        shared += [p.source_id for p in definition_prompts(source, entry["module"]) if p.text.strip() in training_text]
    return shared


@app.command("held-out")
def held_out(val_fraction: float = typer.Option(TrainSettings.val_fraction)) -> None:
    """Record in the bundled model card which stdlib files the training held out (run on the training Python)."""
    from autospec.models import BUNDLED_TARGET, MODEL_CARD

    card = json.loads(MODEL_CARD.read_text())
    root = Path(sysconfig.get_paths()["stdlib"])
    if file_list_hash(stdlib_files(), root) != card["corpus"]["file_list_sha256"]:
        raise typer.BadParameter("this interpreter's stdlib is not the one the pair was trained on "
                                 f"(Python {card['corpus']['python']})")
    held = corpus_held_out(BUNDLED_TARGET / "tokenizer.json", val_fraction)
    held["shared_with_training"] = prompts_shared_with_training(held, root)
    card["corpus"]["held_out"] = held
    MODEL_CARD.write_text(json.dumps(card, indent=2) + "\n")
    typer.echo(json.dumps(card["corpus"]["held_out"], indent=2))


def file_list_hash(files: list[Path], root: Path) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(root).as_posix().encode())
        h.update(b"\0")
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


@app.command()
def data(work: Path = typer.Option(Path(".train"), help="work directory")) -> None:
    """Collect the corpus, train the tokenizer, tokenize."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    work.mkdir(parents=True, exist_ok=True)
    root = Path(sysconfig.get_paths()["stdlib"])
    files = stdlib_files()
    texts = []
    for f in files:
        try:
            texts.append(f.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            continue  # a handful of test files are deliberately not UTF-8
    corpus_info = {
        "source": "Python standard library source (*.py, without site-packages)",
        "python": sys.version.split()[0],
        "stdlib_root": str(root),
        "files": len(files),
        "files_used": len(texts),
        "file_list_sha256": file_list_hash(files, root),
        "characters": sum(len(t) for t in texts),
    }
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    eos_id = tokenizer.token_to_id(EOS)
    ids: list[np.ndarray] = []
    for enc in tokenizer.encode_batch(texts):
        ids.append(np.asarray(enc.ids + [eos_id], dtype=np.uint16))
    tokens = np.concatenate(ids)
    np.save(work / "tokens.npy", tokens)
    tokenizer.save(str(work / "tokenizer.json"))
    corpus_info["tokens"] = int(tokens.size)
    (work / "corpus.json").write_text(json.dumps(corpus_info, indent=2))
    typer.echo(json.dumps(corpus_info, indent=2))


# ----------------------------------------------------------------------------------------- fit
def _llama_config(cfg: ModelConfig, eos_id: int, max_positions: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.hidden_size // cfg.num_heads, max_position_embeddings=max_positions, rms_norm_eps=1e-5,
        tie_word_embeddings=True, bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id,
    )


class _Batches:
    """Random windows of seq_len+1 tokens from the token stream (train) or fixed windows (validation)."""

    def __init__(self, tokens: np.ndarray, seq_len: int, batch: int, seed: int, device):
        import torch

        self.torch = torch
        self.tokens = torch.from_numpy(tokens.astype(np.int64))
        self.seq_len, self.batch, self.device = seq_len, batch, device
        self.gen = torch.Generator().manual_seed(seed)

    def sample(self):
        torch = self.torch
        starts = torch.randint(0, self.tokens.numel() - self.seq_len - 1, (self.batch,), generator=self.gen)
        rows = torch.stack([self.tokens[s: s + self.seq_len + 1] for s in starts.tolist()])
        return rows.to(self.device, non_blocking=True)

    def fixed(self, count: int):
        n = min(count, (self.tokens.numel() - 1) // (self.seq_len + 1))
        rows = self.tokens[: n * (self.seq_len + 1)].view(n, self.seq_len + 1)
        return [rows[i: i + self.batch].to(self.device) for i in range(0, n, self.batch)]


def _lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _train_loop(model, loss_fn, batches: _Batches, steps: int, lr: float, s: TrainSettings, log: list, tag: str):
    import torch

    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    device_type = batches.device.type
    t0 = time.time()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, steps, lr, s.warmup)
        rows = batches.sample()
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=device_type == "cuda"):
            loss = loss_fn(rows)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            entry = {"model": tag, "step": step, "loss": round(float(loss), 4), "elapsed_s": round(time.time() - t0, 1)}
            log.append(entry)
            print(json.dumps(entry), flush=True)


@app.command()
def fit(
    work: Path = typer.Option(Path(".train"), help="work directory written by `data`"),
    device: str = typer.Option("auto", help="cuda, cpu or auto"),
    target_steps: int = typer.Option(TrainSettings.target_steps),
    draft_steps: int = typer.Option(TrainSettings.draft_steps),
    batch_size: int = typer.Option(TrainSettings.batch_size),
    seq_len: int = typer.Option(TrainSettings.seq_len),
    keep_target: bool = typer.Option(False, help="reuse an existing target instead of training a new one"),
    target_dir: Path = typer.Option(None, help="with --keep-target: the target to reuse (default WORK/target)"),
    continue_drafts: bool = typer.Option(False, help="start each draft from WORK/<name> if it exists"),
    only: str = typer.Option("", help="comma-separated draft candidate names to train (default: all)"),
) -> None:
    """Train the target, then distill every draft candidate from it."""
    import torch
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    s = TrainSettings(target_steps=target_steps, draft_steps=draft_steps, batch_size=batch_size, seq_len=seq_len)
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                       ("cpu" if device == "auto" else device))
    torch.manual_seed(s.seed)
    tokens = np.load(work / "tokens.npy")
    n_val = int(tokens.size * s.val_fraction)
    train_tokens, val_tokens = tokens[:-n_val], tokens[-n_val:]
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(work / "tokenizer.json"), eos_token=EOS, bos_token=EOS,
                                        pad_token=EOS, unk_token=None)
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    train_b = _Batches(train_tokens, s.seq_len, s.batch_size, s.seed, dev)
    val_b = _Batches(val_tokens, s.seq_len, s.batch_size, s.seed, dev)
    log: list = []
    max_pos = 2048

    @torch.no_grad()
    def evaluate(fn) -> float:
        losses = []
        for rows in val_b.fixed(64):
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                losses.append(float(fn(rows)))
        return float(np.mean(losses))

    # --- target: next-token prediction (or the one already in WORK/target)
    previous = json.loads((work / "train_log.json").read_text()) if (work / "train_log.json").is_file() else {}
    if keep_target:
        target = LlamaForCausalLM.from_pretrained(target_dir or work / "target", dtype=torch.float32).to(dev)
    else:
        target = LlamaForCausalLM(_llama_config(TARGET, eos_id, max_pos)).to(dev)

    def lm_loss(rows):
        logits = target(rows[:, :-1]).logits.float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1))

    if not keep_target:
        _train_loop(target, lm_loss, train_b, s.target_steps, s.lr, s, log, "target")
    target.eval()
    target_val = evaluate(lm_loss)
    summary = {"device": str(torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"),
               "torch": torch.__version__, "settings": asdict(s), "target": {**asdict(TARGET), "val_loss": target_val},
               "drafts": {}}
    if keep_target:
        summary["settings"]["target_steps"] = previous.get("settings", {}).get("target_steps")
        log = [e for e in previous.get("log", []) if e["model"] == "target"]
    else:
        _save(target, tokenizer, work / "target")
    for p in target.parameters():
        p.requires_grad_(False)

    # --- drafts: distill KL(p_target || p_draft) on the same corpus
    emb = target.model.embed_tokens.weight.detach().float()
    wanted = {n for n in only.split(",") if n}
    for cfg in DRAFTS:
        if wanted and cfg.name not in wanted:
            continue
        if continue_drafts and (work / cfg.name / "config.json").is_file():
            draft = LlamaForCausalLM.from_pretrained(work / cfg.name, dtype=torch.float32).to(dev)
            earlier = previous.get("drafts", {}).get(cfg.name, {}).get(
                "steps", previous.get("settings", {}).get("draft_steps", 0))
            log += [e for e in previous.get("log", []) if e["model"] == cfg.name]
            _distill(draft, cfg, target, train_b, s, log, evaluate, summary, tokenizer, work, earlier)
            continue
        draft = LlamaForCausalLM(_llama_config(cfg, eos_id, max_pos)).to(dev)
        with torch.no_grad():
            if cfg.hidden_size == TARGET.hidden_size:
                draft.model.embed_tokens.weight.copy_(emb)
            else:  # project the target's embeddings onto their top principal directions
                _, _, v = torch.linalg.svd(emb - emb.mean(0), full_matrices=False)
                proj = emb @ v[: cfg.hidden_size].T
                draft.model.embed_tokens.weight.copy_(proj * (emb.norm(dim=1).mean() / proj.norm(dim=1).mean()))

        _distill(draft, cfg, target, train_b, s, log, evaluate, summary, tokenizer, work, 0)
    summary["log"] = log
    (work / "train_log.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k != "log"}, indent=2))


def _distill(draft, cfg: ModelConfig, target, train_b, s: TrainSettings, log: list, evaluate, summary: dict,
             tokenizer, work: Path, earlier_steps: int) -> None:
    """Distill `draft` from the frozen target: minimise KL(p_target || p_draft) per position."""
    import torch
    import torch.nn.functional as F

    def kd_loss(rows):
        inputs = rows[:, :-1]
        with torch.no_grad():
            t_logp = F.log_softmax(target(inputs).logits.float(), dim=-1)
        d_logp = F.log_softmax(draft(inputs).logits.float(), dim=-1)
        return F.kl_div(d_logp.reshape(-1, VOCAB_SIZE), t_logp.reshape(-1, VOCAB_SIZE), log_target=True,
                        reduction="batchmean")

    def draft_lm(rows):
        logits = draft(rows[:, :-1]).logits.float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1))

    _train_loop(draft, kd_loss, train_b, s.draft_steps, s.draft_lr, s, log, cfg.name)
    draft.eval()
    summary["drafts"][cfg.name] = {**asdict(cfg), "steps": earlier_steps + s.draft_steps,
                                   "val_kl_to_target": evaluate(kd_loss), "val_loss": evaluate(draft_lm)}
    _save(draft, tokenizer, work / cfg.name)


def _save(model, tokenizer, out: Path) -> None:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    # The shipped weights are bf16; training continues from the rounded values so that drafts are
    # distilled against exactly the target that ships.
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    model.to(torch.float32)
    tokenizer.save_pretrained(out)


# ----------------------------------------------------------------------------------------- bundle
@app.command()
def bundle(
    work: Path = typer.Option(Path(".train"), help="work directory written by `fit`"),
    draft: str = typer.Option(..., help="name of the draft candidate to bundle"),
) -> None:
    """Copy the pair into the package and write the model card with measured properties."""
    from autospec.models import BUNDLED_DIR
    from training.card import measure_properties

    for name, dest in (("target", "target"), (draft, "draft")):
        src = work / name
        if not src.is_dir():
            raise typer.BadParameter(f"{src} does not exist; run `fit` first")
        out = BUNDLED_DIR / dest
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        # Re-save through transformers in shards of <= 16 MB: same bf16 tensors, but no single file is
        # large enough to trouble a git host, and HF, vLLM and our loader all read sharded checkpoints.
        from transformers import AutoModelForCausalLM, AutoTokenizer

        AutoModelForCausalLM.from_pretrained(src, dtype="auto").save_pretrained(out, max_shard_size="16MB")
        AutoTokenizer.from_pretrained(src).save_pretrained(out)
    train_log = json.loads((work / "train_log.json").read_text())
    card = {
        "name": "autospec bundled pair",
        "corpus": json.loads((work / "corpus.json").read_text()),
        "tokenizer": {"type": "byte-level BPE (tokenizers)", "vocab_size": VOCAB_SIZE, "eos": EOS},
        "training": {k: v for k, v in train_log.items() if k not in ("log", "drafts")},
        "draft_training": train_log["drafts"][draft],
        "draft_candidates": train_log["drafts"],
        "loss_curve": train_log["log"],
        "properties": measure_properties(BUNDLED_DIR / "target", BUNDLED_DIR / "draft"),
    }
    (BUNDLED_DIR / "model_card.json").write_text(json.dumps(card, indent=2))
    typer.echo(json.dumps(card["properties"], indent=2))


if __name__ == "__main__":
    app()
