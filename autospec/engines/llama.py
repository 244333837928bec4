"""A compact Llama-family forward pass over Hugging Face weights, built for speculative decoding.

Why not call transformers' model directly: SD needs packed variable-length batches over per-request KV
caches (each request verifies a different number of tokens at a different position), rollback of
rejected positions by simply shortening a request's length, and layer-by-layer execution (FASER's early
exit). This module does that in ~20 tensor ops per layer, which also keeps the per-step overhead low at
batch 1 on a CPU. It loads the same `config.json` + safetensors a HF `LlamaForCausalLM`,
`Qwen2ForCausalLM` or `Qwen3ForCausalLM` directory holds, and is checked numerically against
transformers in the tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from autospec.errors import InputError, parse_json, read_text_file

SUPPORTED_ARCHITECTURES = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM"}


def config_max_positions(cfg: dict) -> int | None:
    """The positions a model was trained for: a Hugging Face config.json's max_position_embeddings (a
    multimodal config's `text_config`'s); None when it names no positive whole number. (vLLM's
    `served_max_model_len` reads the same key itself: importing this module would load torch there.)"""
    text = cfg.get("text_config")
    own = cfg.get("max_position_embeddings") or (text.get("max_position_embeddings")
                                                 if isinstance(text, dict) else None)
    return own if isinstance(own, int) and not isinstance(own, bool) and own > 0 else None


@dataclass(frozen=True)
class LlamaShape:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2, or Llama with attention_bias
    o_bias: bool  # Llama with attention_bias
    qk_norm: bool  # Qwen3
    architecture: str
    eos_token_ids: tuple[int, ...]
    # the positions the model was trained for (config max_position_embeddings; None: the config does not
    # say): past it RoPE extrapolates and the output is garbage, so the engine refuses longer requests
    max_positions: int | None = None

    @classmethod
    def from_config(cls, cfg: dict, path: Path) -> "LlamaShape":
        archs = cfg.get("architectures") or ["LlamaForCausalLM"]
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise InputError(f"architecture {arch} is not supported (supported: "
                             f"{', '.join(sorted(SUPPORTED_ARCHITECTURES))})", path=path, field="architectures")
        scaling = cfg.get("rope_scaling") or {}
        if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
            raise InputError(f"rope_scaling {scaling} is not supported", path=path, field="rope_scaling")
        try:
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            eos = cfg.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
            rope_theta = cfg.get("rope_theta")
            if rope_theta is None:  # transformers 5 nests it under rope_parameters
                rope_theta = (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
            attention_bias = bool(cfg.get("attention_bias", False))
            return cls(
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                rope_theta=float(rope_theta),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                qkv_bias=arch == "Qwen2ForCausalLM" or attention_bias,
                o_bias=arch in ("LlamaForCausalLM", "MistralForCausalLM") and attention_bias,
                qk_norm=arch == "Qwen3ForCausalLM",
                architecture=arch,
                eos_token_ids=eos_ids,
                max_positions=config_max_positions(cfg),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"config.json is missing or has a bad field: {exc}", path=path) from None


class KVCache:
    """Key/value storage for a set of request slots: one tensor [layers, 2, slots, kv_heads, capacity, head_dim].

    A request owns a slot; its cached length lives with the engine. Rolling back rejected draft
    positions is just lowering that length — stale entries beyond it are never attended to and get
    overwritten. One tensor (instead of one per layer) makes moving a slot a single copy.
    """

    def __init__(self, shape: LlamaShape, device: torch.device, dtype: torch.dtype):
        self.shape = shape
        self.device = device
        self.dtype = dtype
        self.data = torch.empty(shape.num_layers, 2, 0, shape.num_kv_heads, 0, shape.head_dim, device=device,
                                dtype=dtype)

    @property
    def slots(self) -> int:
        return self.data.shape[2]

    @property
    def capacity(self) -> int:
        return self.data.shape[4]

    def ensure(self, slots: int, capacity: int) -> None:
        """Grow (never shrink) to at least `slots` x `capacity`, keeping contents. Grows geometrically."""
        if slots <= self.slots and capacity <= self.capacity:
            return
        new_slots = max(slots, self.slots)
        new_cap = self.capacity
        if capacity > new_cap:
            new_cap = max(capacity, int(new_cap * 1.5), 64)
            new_cap = (new_cap + 63) // 64 * 64
        s = self.shape
        # Zeros, not empty: masked-out positions still pass through softmax(QK)·V with weight 0, and
        # 0 · NaN from uninitialised memory would poison real outputs.
        grown = torch.zeros(s.num_layers, 2, new_slots, s.num_kv_heads, new_cap, s.head_dim, device=self.device,
                            dtype=self.dtype)
        if self.data.numel():
            grown[:, :, : self.slots, :, : self.capacity] = self.data
        self.data = grown

    def move_slot(self, src: int, dst: int, length: int) -> None:
        if src != dst and length > 0:
            self.data[:, :, dst, :, :length] = self.data[:, :, src, :, :length]

    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()


class CompactLlama:
    """Weights of one causal LM plus a batched forward over a KVCache."""

    def __init__(self, model_dir: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
        self.path = Path(model_dir)
        config_path = self.path / "config.json"
        if not self.path.is_dir():
            raise InputError("model directory does not exist", path=self.path)
        if not config_path.is_file():
            raise InputError("no config.json in the model directory", path=self.path)
        cfg = parse_json(read_text_file(config_path, "config.json"), path=config_path)
        if not isinstance(cfg, dict):
            raise InputError("config.json is not a JSON object", path=config_path)
        self.config = cfg
        self.shape = LlamaShape.from_config(cfg, config_path)
        self.device = torch.device(device)
        self.dtype = dtype
        self._load_weights(self._read_safetensors())
        self._init_rope()

    @classmethod
    def random(cls, config: dict, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
               seed: int = 0, std: float = 0.02) -> "CompactLlama":
        """A model of `config`'s shape with N(0, std) weights (norms at 1), built on `device` without any
        files: benchmarks at real architecture sizes (e.g. Qwen3-8B-shaped) need no download."""
        self = cls.__new__(cls)
        self.path = Path(f"<random:{config.get('architectures', ['LlamaForCausalLM'])[0]}>")
        self.config = dict(config)
        self.shape = LlamaShape.from_config(self.config, self.path)
        self.device = torch.device(device)
        self.dtype = dtype
        s = self.shape
        gen = torch.Generator(device=self.device).manual_seed(seed)

        def rand(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=gen, device=self.device, dtype=dtype) * std

        ones = lambda n: torch.ones(n, device=self.device, dtype=dtype)  # noqa: E731
        q, kv, hd = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.head_dim
        w = {"model.embed_tokens.weight": rand(s.vocab_size, s.hidden_size), "model.norm.weight": ones(s.hidden_size)}
        if not s.tie_word_embeddings:
            w["lm_head.weight"] = rand(s.vocab_size, s.hidden_size)
        for i in range(s.num_layers):
            p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
            w.update({p + "input_layernorm.weight": ones(s.hidden_size),
                      p + "post_attention_layernorm.weight": ones(s.hidden_size),
                      a + "q_proj.weight": rand(q, s.hidden_size), a + "k_proj.weight": rand(kv, s.hidden_size),
                      a + "v_proj.weight": rand(kv, s.hidden_size), a + "o_proj.weight": rand(s.hidden_size, q),
                      p + "mlp.gate_proj.weight": rand(s.intermediate_size, s.hidden_size),
                      p + "mlp.up_proj.weight": rand(s.intermediate_size, s.hidden_size),
                      p + "mlp.down_proj.weight": rand(s.hidden_size, s.intermediate_size)})
            if s.qkv_bias:
                w.update({a + "q_proj.bias": rand(q), a + "k_proj.bias": rand(kv), a + "v_proj.bias": rand(kv)})
            if s.o_bias:
                w[a + "o_proj.bias"] = rand(s.hidden_size)
            if s.qk_norm:
                w.update({a + "q_norm.weight": ones(hd), a + "k_norm.weight": ones(hd)})
        self._load_weights(w)
        del w
        self._init_rope()
        return self

    def _init_rope(self) -> None:
        s = self.shape
        inv_freq = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, dtype=torch.float64) / s.head_dim))
        self._inv_freq = inv_freq.to(torch.float32)
        self._rope_cos = torch.empty(0, s.head_dim, device=self.device, dtype=self.dtype)
        self._rope_sin = torch.empty(0, s.head_dim, device=self.device, dtype=self.dtype)

    # ---------------------------------------------------------------- loading
    def _read_safetensors(self) -> dict[str, torch.Tensor]:
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            raise InputError("no *.safetensors weights in the model directory", path=self.path)
        tensors: dict[str, torch.Tensor] = {}
        for f in files:
            tensors.update(load_file(str(f)))
        return tensors

    def _load_weights(self, w: dict[str, torch.Tensor]) -> None:
        s = self.shape

        def take(name: str) -> torch.Tensor:
            if name not in w:
                raise InputError(f"weights lack tensor {name}", path=self.path)
            return w[name].to(device=self.device, dtype=self.dtype)

        self.embed = take("model.embed_tokens.weight")
        if self.embed.shape != (s.vocab_size, s.hidden_size):
            raise InputError(f"embedding shape {tuple(self.embed.shape)} does not match config", path=self.path)
        tied = s.tie_word_embeddings and "lm_head.weight" not in w
        self.lm_head = Projection(self.embed if tied else take("lm_head.weight"))
        self.final_norm = take("model.norm.weight")
        self.layers = []
        for i in range(s.num_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            # q/k/v and gate/up are fused: five matmuls become two, and fewer ops is lower overhead.
            layer = {
                "attn_norm": take(p + "input_layernorm.weight"),
                "mlp_norm": take(p + "post_attention_layernorm.weight"),
                "qkv": Projection(torch.cat([take(a + "q_proj.weight"), take(a + "k_proj.weight"),
                                             take(a + "v_proj.weight")]),
                                  torch.cat([take(a + "q_proj.bias"), take(a + "k_proj.bias"),
                                             take(a + "v_proj.bias")]) if s.qkv_bias else None),
                "o": Projection(take(a + "o_proj.weight"), take(a + "o_proj.bias") if s.o_bias else None),
                "gate_up": Projection(torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")])),
                "down": Projection(take(p + "mlp.down_proj.weight")),
            }
            if s.qk_norm:
                layer["q_norm"] = take(a + "q_norm.weight")
                layer["k_norm"] = take(a + "k_norm.weight")
            self.layers.append(layer)

    def parameter_count(self) -> int:
        n = self.embed.numel() + self.final_norm.numel()
        if not self.shape.tie_word_embeddings:
            n += self.lm_head.numel()
        for layer in self.layers:
            n += sum(t.numel() for t in layer.values() if t is not None)
        return n

    def new_cache(self) -> KVCache:
        return KVCache(self.shape, self.device, self.dtype)

    # ---------------------------------------------------------------- forward
    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        needed = int(positions.max()) + 1
        if needed > self._rope_cos.shape[0]:
            n = max(needed, 2 * self._rope_cos.shape[0], 256)
            freqs = torch.outer(torch.arange(n, dtype=torch.float32), self._inv_freq)
            emb = torch.cat([freqs, freqs], dim=-1)
            self._rope_cos = emb.cos().to(self.device, self.dtype)
            self._rope_sin = emb.sin().to(self.device, self.dtype)
        return self._rope_cos[positions], self._rope_sin[positions]

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, self.embed)

    def forward(
        self,
        tokens: torch.Tensor,  # [B, Q] int64, padded
        cache: KVCache,
        rows: torch.Tensor,  # [B] int64 slot per batch row
        lens: torch.Tensor,  # [B] int64 tokens already cached per row
        q_lens: torch.Tensor,  # [B] int64 real (unpadded) new tokens per row
        logits_at: torch.Tensor | None = None,  # [B, J] positions (0..Q-1) whose logits are wanted; None = all
        layer_hook=None,
    ) -> torch.Tensor:
        """Run new tokens through the model, writing their K/V into the cache; return logits [B, J, V].

        The caller guarantees `cache.capacity >= lens + Q` for every row. Padded positions write K/V
        beyond a row's real length, where no real query ever looks.

        `layer_hook(layer_index, hidden)` is called after every layer with the residual stream
        [B, Q', H]; if it returns an int w < Q' the batch continues with positions 0..w-1 only (token-wise
        early exit), and the logits come back [B, w, V] (or at `logits_at`, which must then be < w).
        """
        s = self.shape
        B, Q = tokens.shape
        positions = lens[:, None] + torch.arange(Q, device=self.device)[None, :]  # [B, Q]
        cos, sin = self._rope(positions)
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # [B, Q, 1, D]
        kv_len = int((lens + Q).max())
        row_list = rows.tolist()
        first = min(row_list)
        # The rows are one block of slots (the engine keeps slots dense, so a step over every live request
        # is one): attend to a view of that block instead of gathering its K/V, which copies the whole
        # context per layer and cost +50% per batch-8 verify in a replay, where the batch's order is
        # rarely the slots' order. Only the queries (and the mask) are put in slot order, and back.
        contiguous = sorted(row_list) == list(range(first, first + B))
        order = restore = None
        if contiguous and row_list != list(range(first, first + B)):
            order = torch.argsort(rows)
            restore = torch.argsort(order)
        # A mask is only needed when rows differ in length or several queries must be causal.
        needs_mask = Q > 1 or bool((lens != lens[0]).any())
        mask = None
        if needs_mask:
            key_pos = torch.arange(kv_len, device=self.device)
            mask = key_pos[None, None, :] <= positions[:, :, None]  # [B, Q, L]
            mask = mask[:, None]  # [B, 1, Q, L]
        n_q, n_kv, hd = s.num_heads, s.num_kv_heads, s.head_dim
        # GQA as n_kv heads of group·Q queries each (query head h reads KV head h // group, so heads
        # g·group .. g·group + group − 1 fold onto KV head g): one plain attention call, ~25% faster on
        # the CPU than SDPA's enable_gqa at batch 32 with a handful of queries per row.
        group = n_q // n_kv

        def grouped(mask: torch.Tensor | None) -> torch.Tensor | None:
            return mask.repeat(1, 1, group, 1) if mask is not None and group > 1 else mask

        group_mask = grouped(mask)
        row_index = rows[:, None].expand(B, Q)
        x = self.embed_tokens(tokens)
        for li, layer in enumerate(self.layers):
            h = F.rms_norm(x, (s.hidden_size,), layer["attn_norm"], s.rms_norm_eps)
            qkv = layer["qkv"](h)
            qk = qkv[..., : (n_q + n_kv) * hd].view(B, Q, n_q + n_kv, hd)
            v = qkv[..., (n_q + n_kv) * hd:].view(B, Q, n_kv, hd)
            if s.qk_norm:
                q_part = F.rms_norm(qk[:, :, :n_q], (hd,), layer["q_norm"], s.rms_norm_eps)
                k_part = F.rms_norm(qk[:, :, n_q:], (hd,), layer["k_norm"], s.rms_norm_eps)
                qk = torch.cat([q_part, k_part], dim=2)
            half = hd // 2
            rotated = torch.cat([-qk[..., half:], qk[..., :half]], dim=-1)
            qk = qk * cos + rotated * sin
            q, k = qk[:, :, :n_q], qk[:, :, n_q:]
            kv_layer = cache.data[li]
            # cache layout is [slot, kv_head, pos, dim]; write the new K/V rows at (slot, :, pos)
            kv_layer[0].permute(0, 2, 1, 3).index_put_((row_index, positions), k)
            kv_layer[1].permute(0, 2, 1, 3).index_put_((row_index, positions), v)
            queries = q.transpose(1, 2).reshape(B, n_kv, group * Q, hd)
            if contiguous:
                keys = kv_layer[0, first: first + B, :, :kv_len]
                values = kv_layer[1, first: first + B, :, :kv_len]
            else:
                keys = kv_layer[0, :, :, :kv_len].index_select(0, rows)
                values = kv_layer[1, :, :, :kv_len].index_select(0, rows)
            if order is None:
                attn = F.scaled_dot_product_attention(queries, keys, values, attn_mask=group_mask)
            else:
                attn = F.scaled_dot_product_attention(queries[order], keys, values, attn_mask=None
                                                      if group_mask is None else group_mask[order])[restore]
            attn = attn.view(B, n_q, Q, hd).transpose(1, 2).reshape(B, Q, n_q * hd)
            x = x + layer["o"](attn)
            h = F.rms_norm(x, (s.hidden_size,), layer["mlp_norm"], s.rms_norm_eps)
            gate, up = layer["gate_up"](h).chunk(2, dim=-1)
            x = x + layer["down"](F.silu(gate) * up)
            if layer_hook is not None:
                width = layer_hook(li, x)
                if width is not None and 0 < width < Q:
                    # Early exit: positions >= width leave the remaining layers (their K/V beyond a
                    # row's committed length are rolled back by length, like rejected drafts).
                    Q = int(width)
                    x, positions, row_index = x[:, :Q], positions[:, :Q], row_index[:, :Q]
                    cos, sin = cos[:, :Q], sin[:, :Q]
                    kv_len = int((lens + Q).max())
                    if mask is not None:
                        mask = mask[:, :, :Q, :kv_len]
                        group_mask = grouped(mask)
        if logits_at is not None:
            x = x.gather(1, logits_at[:, :, None].expand(-1, -1, s.hidden_size))
        return self.head(x)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head (also used by early exit on intermediate hidden states)."""
        s = self.shape
        return self.lm_head(F.rms_norm(hidden, (s.hidden_size,), self.final_norm, s.rms_norm_eps))


class Projection:
    """y = x·Wᵀ + b, dispatched to the CPU kernel that is fastest for the number of rows.

    Measured on a 2-core AMD EPYC (benchmarks/engine_speed.py): MKL's sgemm handles one row well but
    costs ~M times one row for M = 2..4 rows (it streams the weights once per row), which would make
    verifying k+1 tokens cost k+1 decode steps. oneDNN's packed-weight kernel streams them once, so
    its cost is nearly flat in M. One row keeps MKL's `x @ Wᵀ` (oneDNN has a larger fixed cost);
    several rows use oneDNN. On CUDA (or without oneDNN) it is a plain matmul.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.out_features, self.in_features = weight.shape
        self.weight_t = weight.t().contiguous()  # [in, out]: `x @ w` beats F.linear for one row
        self.bias = bias
        self.packed = None
        if weight.device.type == "cpu" and weight.dtype == torch.float32 and torch.backends.mkldnn.is_available():
            try:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 4)
            except (RuntimeError, AttributeError):
                self.packed = None

    def numel(self) -> int:
        return self.weight_t.numel() + (0 if self.bias is None else self.bias.numel())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if self.packed is not None and rows >= MULTI_ROW_ONEDNN:
            y = torch.ops.mkldnn._linear_pointwise(x.reshape(rows, self.in_features), self.packed, self.bias,
                                                    "none", [], "")
            return y.view(*x.shape[:-1], self.out_features)
        y = x @ self.weight_t
        return y if self.bias is None else y + self.bias


MULTI_ROW_ONEDNN = 2  # rows from which Projection uses oneDNN (see its docstring)
