"""GPT-2-style language models from HuggingFace ``transformers``, built from a config (no download).

``transformers:gpt2`` (124M parameters), ``-medium``, ``-large``, ``-xl`` follow the
published GPT-2 shapes; ``transformers:tiny-gpt2`` is a 2-layer model for tests. The
input is a batch of token ids of shape ``(batch, seq_len)``: ``input_size`` is
``[seq_len]``. The model returns the logits only (one tensor, as the chain needs) and
uses the eager attention implementation, so that it computes the same on every device.
Registered only when ``transformers`` can be imported.
"""

from __future__ import annotations

from typing import Any, Sequence

from harness.protocols import Workload

PREFIX = "transformers:"

# name: (n_layer, n_embd, n_head, vocab, n_positions)
CONFIGS: dict[str, tuple[int, int, int, int, int]] = {
    "gpt2": (12, 768, 12, 50257, 1024),
    "gpt2-medium": (24, 1024, 16, 50257, 1024),
    "gpt2-large": (36, 1280, 20, 50257, 1024),
    "gpt2-xl": (48, 1600, 25, 50257, 1024),
    "tiny-gpt2": (2, 64, 4, 1000, 128),
}


def available() -> bool:
    """Whether ``transformers`` (and torch) can be imported."""
    try:
        import transformers  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken install is as good as none
        return False
    return True


def _logits_only(model: Any) -> Any:
    from torch import nn

    class LogitsOnly(nn.Module):
        """Calls a causal LM without cache and returns its logits tensor."""

        def __init__(self, lm: nn.Module) -> None:
            super().__init__()
            self.lm = lm

        def forward(self, input_ids):
            """Logits for a batch of token ids."""
            return self.lm(input_ids=input_ids, use_cache=False, return_dict=True).logits

    return LogitsOnly(model)


class TransformersModels:
    """Model factory for ``transformers:<name>``: GPT-2-shaped models with random weights."""

    name = "transformers"
    description = "GPT-2-style language models built from a config (no download), e.g. transformers:gpt2"

    def names(self) -> Sequence[str]:
        """``transformers:gpt2`` and its sizes, plus ``transformers:tiny-gpt2``."""
        return [PREFIX + n for n in CONFIGS]

    def default_input_size(self, model: str) -> tuple[int, ...]:
        """The model's full context: 1024 tokens (128 for tiny-gpt2)."""
        return (CONFIGS[model.removeprefix(PREFIX)][4],)

    def check_input_size(self, model: str, size: Sequence[int]) -> str | None:
        """What is wrong with ``size`` for ``model`` (None: nothing): a sequence length within the context."""
        if len(size) != 1:
            return f"{model} takes token ids: input_size [seq_len], got {list(size)}"
        n_positions = CONFIGS[model.removeprefix(PREFIX)][4] if model.removeprefix(PREFIX) in CONFIGS else None
        if n_positions is not None and not 1 <= int(size[0]) <= n_positions:
            return f"{model} takes 1 to {n_positions} tokens, got {int(size[0])}"
        return None

    def build(self, workload: Workload, device: Any = "cpu") -> tuple[Any, Any]:
        """The model in training mode on ``device`` and a batch of random token ids."""
        from transformers import GPT2Config, GPT2LMHeadModel

        from harness.models.build import on_device, prepare, token_batch

        arch = workload.model.removeprefix(PREFIX)
        if arch not in CONFIGS:
            raise ValueError(f"no transformers model {arch!r}; choose from {', '.join(CONFIGS)}")
        n_layer, n_embd, n_head, vocab, n_positions = CONFIGS[arch]
        wrong = self.check_input_size(workload.model, workload.input_size)
        if wrong:
            raise ValueError(wrong)
        seq = int(workload.input_size[0])
        config = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab,
                            n_positions=n_positions, bos_token_id=vocab - 1, eos_token_id=vocab - 1)
        config._attn_implementation = "eager"
        model = on_device(lambda: _logits_only(GPT2LMHeadModel(config)), device)
        model = prepare(model, device, workload.dtype)
        return model, token_batch(workload.batch_size, seq, vocab, device)
