"""oneDNN linear layers with weights reordered once, for speculative decoding on CPU.

On CPU, `torch.nn.functional.linear` in float32 goes to MKL's sgemm. For a few rows, which is exactly what a
speculative round asks of the target (verify k + 1 tokens), it is far from the memory bound: on the 2-core machine
of `eval/` (`python -m eval.costs --dtype float32`) a float32 forward of Qwen2.5-Coder-1.5B on a 200-token cache
took 429 ms for 1 token, 822 ms for 2, 1219 ms for 3 and 830-960 ms for 5 to 9, so a speculative round cost two to
three plain decoding steps and drafting hardly paid. With every weight reordered once into oneDNN's blocked layout
(the packed oneDNN linear that `torch.compile`'s CPU freezing pass emits when the number of rows varies, here
without a compile; `--prepack`) the same forwards took 304, 362, 401 and 362-434 ms, and the 0.5B draft's 1-token
forward 88 ms instead of 162.

[`prepack_linear_weights`] is opt-in and for inference only: the reordered weights are opaque oneDNN tensors, so a
prepacked model can no longer be saved, moved or trained (load it again for that). Outputs agree with the stock
kernels to float rounding (another summation order); apply it to the model you compare against as well, since
"equal to the target's greedy output" is a statement about one set of kernels.
"""

import torch
from torch import nn


class PrepackedLinear(nn.Module):
    """An `nn.Linear` whose weight was reordered once for oneDNN; `weight.shape` still reads `[out, in]`."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # The hint 1 is the batch the layout is tuned for: decoding and verification pass a few rows.
        packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), 1)
        self.weight = nn.Parameter(packed, requires_grad=False)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., out]; the op takes rows.
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, self.in_features), self.weight, self.bias, "none", [], "")
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _linear_names(model: nn.Module) -> list[str]:
    # The model's own submodules (`name` is empty for `model` itself, which has no parent to hold a replacement).
    return [name for name, module in model.named_modules() if name and type(module) is nn.Linear]


def prepack_supported(dtype: torch.dtype) -> bool:
    """Whether this torch and CPU can prepack linear layers of `dtype` (float32 with oneDNN; bfloat16 also needs the
    CPU's bfloat16 instructions: AVX-512 BW/VL/DQ or AVX-NE-CONVERT)."""
    if not torch.backends.mkldnn.is_available() or dtype not in (torch.float32, torch.bfloat16):
        return False
    return dtype == torch.float32 or bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _refuse_unsupported(model: nn.Module, names: list[str]) -> None:
    # A function of its own so that no local keeps a dense weight alive during the replacement.
    for name in names:
        weight = model.get_submodule(name).weight
        if weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(
                f"prepack_linear_weights is for CPU float32/bfloat16 models; `{name}` is {weight.dtype} on "
                f"{weight.device}. Nothing was changed."
            )
        if not prepack_supported(weight.dtype):
            raise ValueError(
                f"This CPU cannot prepack {weight.dtype} linear layers (oneDNN's bfloat16 path needs AVX-512 BW/VL/DQ "
                "or AVX-NE-CONVERT). Prepack a float32 model, or keep torch's stock kernels. Nothing was changed."
            )


def prepack_linear_weights(*models: nn.Module) -> int:
    """Replaces every `nn.Linear` of each of `models` (say a target and its draft) by a [`PrepackedLinear`], in
    place, and returns how many it replaced.

    Only for inference on CPU in float32 or bfloat16 (see the module's docstring for what it gains and costs). A
    weight shared with another module (a tied `lm_head`) is copied into the new layout, the other module keeps the
    original; an untied weight is released.

    Raises:
        `ValueError`: if this torch has no oneDNN, or a linear layer of any of `models` is not a CPU
            float32/bfloat16 layer (then no model is changed).
    """
    if not torch.backends.mkldnn.is_available():
        raise ValueError("prepack_linear_weights needs a torch built with oneDNN (mkldnn), as the x86 CPU wheels are.")
    names = [_linear_names(model) for model in models]
    for model, model_names in zip(models, names):
        _refuse_unsupported(model, model_names)
    # One layer at a time, holding no other reference: each dense weight is released as soon as it is replaced, so
    # memory peaks at the models plus one layer, not twice the models.
    for model, model_names in zip(models, names):
        for name in model_names:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            setattr(parent, child, PrepackedLinear(getattr(parent, child)))
    return sum(map(len, names))
