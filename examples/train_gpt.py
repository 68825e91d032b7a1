"""Train a small GPT twice, with pysoftmax's attention softmax and with torch's, and compare.

The model is a character-level causal language model trained on a synthetic text of addition
and subtraction facts (``17+25=42;83-90=-7;...``) generated here from a seed, so nothing is
downloaded or read from disk. Both runs share the data, the order of the batches and the initial
weights; the only difference is the softmax inside attention:

* ``pysoftmax``: ``pysoftmax.torch.softmax(scores, scale=scale, causal=True)``, which applies the
  scale and the causal mask inside the kernel;
* ``torch``: ``torch.softmax(scores * scale + mask, dim=-1)`` with a precomputed additive mask.

The losses step by step and the median time of a training step are printed as a markdown table::

    python3 examples/train_gpt.py --steps 300
    python3 examples/train_gpt.py --device cpu --impl torch --steps 30 --layers 2 --d-model 64

On CUDA (or ROCm) the forward and backward run under bfloat16 autocast with float32 weights.
"""

import argparse
import contextlib
import dataclasses
import json
import math
import pathlib
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

IMPLS = ("pysoftmax", "torch")
WARMUP_SKIP = 5  # steps left out of the timing: allocator growth, kernel selection, first launches


def make_dataset(n_chars, seed):
    """A text of arithmetic facts ``a+b=c;`` / ``a-b=c;`` with ``a, b`` in 0..99.

    Returns
    -------
    data : torch.LongTensor of shape ``(n_chars,)``, the text's characters as indices into ``vocab``
    vocab : list of str, the sorted distinct characters of the text
    """
    gen = torch.Generator().manual_seed(seed)
    n_facts = n_chars // 6 + 1  # "1+2=3;" is the shortest fact, so this many always suffice
    a, b = torch.randint(0, 100, (2, n_facts), generator=gen).tolist()
    minus = torch.randint(0, 2, (n_facts,), generator=gen).tolist()
    text = "".join(f"{x}-{y}={x - y};" if m else f"{x}+{y}={x + y};" for x, y, m in zip(a, b, minus))
    text = text[:n_chars]
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    return torch.tensor([index[c] for c in text], dtype=torch.long), vocab


@dataclasses.dataclass
class Config:
    vocab_size: int = 14  # what make_dataset's text uses; train() sets it from the data
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 8
    seq_len: int = 256
    batch_size: int = 32
    lr: float = 1e-3
    warmup_steps: int = 20
    weight_decay: float = 0.1
    data_chars: int = 1_000_000
    softmax: str = "pysoftmax"


def _softmax_pysoftmax(scores, scale, mask):
    # Imported here so that the torch path runs where the HIP library is not built. The kernel
    # masks from the indices itself, so the additive mask is not read.
    import pysoftmax.torch as pst

    return pst.softmax(scores, scale=scale, causal=True)


def _softmax_torch(scores, scale, mask):
    return torch.softmax(scores * scale + mask, dim=-1)


# attn_softmax(scores, scale, mask) -> probabilities; mask is additive, -inf above the diagonal.
SOFTMAX = {"pysoftmax": _softmax_pysoftmax, "torch": _softmax_torch}


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"d_model={cfg.d_model} is not a multiple of n_heads={cfg.n_heads}")
        if cfg.softmax not in SOFTMAX:
            raise ValueError(f"softmax={cfg.softmax!r}: expected one of {sorted(SOFTMAX)}")
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.attn_softmax = SOFTMAX[cfg.softmax]

    def forward(self, x, mask):
        b, t, d = x.shape
        head_dim = d // self.n_heads
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, head_dim).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1)
        y = self.attn_softmax(scores, 1.0 / math.sqrt(head_dim), mask) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(), nn.Linear(4 * cfg.d_model, cfg.d_model)
        )

    def forward(self, x, mask):
        x = x + self.attn(self.ln1(x), mask)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Pre-LayerNorm decoder: token and learned position embeddings, ``n_layers`` blocks, a head
    tied to the token embedding. ``forward(idx)`` maps ``(batch, t)`` indices to ``(batch, t,
    vocab_size)`` logits, ``t <= seq_len``."""

    def __init__(self, cfg):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        mask = torch.full((cfg.seq_len, cfg.seq_len), float("-inf")).triu(1)
        self.register_buffer("mask", mask, persistent=False)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        # Small weights keep the first steps' logits near uniform, the usual GPT-2 choice.
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear):
            nn.init.zeros_(m.bias)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        mask = self.mask[:t, :t]
        for block in self.blocks:
            x = block(x, mask)
        return F.linear(self.ln_f(x), self.tok.weight)


def _lr_factor(step, steps, warmup):
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.45 * (1.0 + math.cos(math.pi * progress))


def train(config, steps, device="cuda", seed=0, log_every=50):
    """Train ``GPT(config)`` for ``steps`` steps and return the loss of each and the step time.

    The weights are initialised on the CPU under ``torch.manual_seed(seed)`` and the batches come
    from a CPU ``torch.Generator`` seeded with ``seed``, so runs that differ only in
    ``config.softmax`` start from the same weights and see the same batches. ``log_every=0`` is
    silent.

    Returns
    -------
    dict with ``impl``, ``losses`` (one float a step), ``step_ms`` (median over the steps after the
    first few), ``step_ms_all``, ``n_params``, ``device`` and ``config`` (as a dict).
    """
    device = torch.device(device)
    data, vocab = make_dataset(config.data_chars, seed)
    config = dataclasses.replace(config, vocab_size=len(vocab))
    torch.manual_seed(seed)
    model = GPT(config).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},  # biases, LayerNorm
    ]
    opt = torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, steps, config.warmup_steps))
    gen = torch.Generator().manual_seed(seed)
    window = torch.arange(config.seq_len + 1)
    cuda = device.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    losses, times = [], []
    for step in range(steps):
        starts = torch.randint(len(data) - config.seq_len - 1, (config.batch_size, 1), generator=gen)
        chunk = data[starts + window].to(device)
        x, y = chunk[:, :-1], chunk[:, 1:]
        sync()
        t0 = time.perf_counter()
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
        with autocast:
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, config.vocab_size), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
        losses.append(loss.item())
        if log_every and (step + 1) % log_every == 0:
            print(f"[{config.softmax}] step {step + 1}/{steps} loss {losses[-1]:.4f} {times[-1]:.2f} ms", flush=True)
    return {
        "impl": config.softmax,
        "losses": losses,
        "step_ms": statistics.median(times[WARMUP_SKIP:] or times),
        "step_ms_all": times,
        "n_params": sum(p.numel() for p in params),
        "device": str(device),
        "config": dataclasses.asdict(config),
    }


def compare(steps=300, device="cuda", seed=0, log_every=0, **config_overrides):
    """Run ``train`` once per softmax implementation with the same seed; ``{impl: result}``."""
    return {
        impl: train(Config(**config_overrides, softmax=impl), steps, device, seed, log_every)
        for impl in IMPLS
    }


def format_table(result, every=25):
    """Markdown table of the losses at steps 1, ``every``, ``2*every``, ... and the last step,
    followed by each implementation's median ms/step. ``result`` maps impl to ``train``'s result;
    the difference column (pysoftmax - torch) is there when both are."""
    impls = [i for i in IMPLS if i in result]
    losses = [result[i]["losses"] for i in impls]
    n = len(losses[0])
    both = len(impls) == 2
    header = ["step"] + [f"loss {i}" for i in impls] + (["difference"] if both else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    for s in sorted({1, n, *range(every, n + 1, every)}):
        row = [str(s)] + [f"{l[s - 1]:.4f}" for l in losses]
        if both:
            row.append(f"{losses[0][s - 1] - losses[1][s - 1]:+.4f}")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    for i in impls:
        lines.append(f"median step time, {i}: {result[i]['step_ms']:.2f} ms")
    if both:
        speedup = result["torch"]["step_ms"] / result["pysoftmax"]["step_ms"]
        lines.append(f"pysoftmax speed-up (torch ms / pysoftmax ms): {speedup:.2f}x")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--device", default="cuda")
    p.add_argument("--impl", choices=("both",) + IMPLS, default="both")
    p.add_argument("--every", type=int, default=25, help="table row (and progress line) interval")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="write the results here")
    for flag, field in [("--layers", "n_layers"), ("--d-model", "d_model"), ("--heads", "n_heads"),
                        ("--seq-len", "seq_len"), ("--batch", "batch_size")]:
        p.add_argument(flag, dest=field, type=int)
    args = p.parse_args(argv)
    if args.impl != "torch" and torch.device(args.device).type != "cuda":
        p.error("the pysoftmax softmax needs a GPU; on the CPU use --impl torch")
    overrides = {f: getattr(args, f) for f in ("n_layers", "d_model", "n_heads", "seq_len", "batch_size")
                 if getattr(args, f) is not None}
    if args.impl == "both":
        result = compare(args.steps, args.device, args.seed, args.every, **overrides)
    else:
        result = {args.impl: train(Config(**overrides, softmax=args.impl), args.steps, args.device,
                                   args.seed, args.every)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(format_table(result, args.every))
    return 0


if __name__ == "__main__":
    # Run as a script from a checkout: the package beside examples/ is the one to use.
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
    sys.exit(main())
