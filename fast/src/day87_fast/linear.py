"""day87_fast.Linear: torch.nn.Linear's layer computed by day87_fast's operator."""

import torch

from . import layouts, lesson_copy


class Linear(torch.nn.Linear):
    """A drop-in for torch.nn.Linear: y = x @ weight.t() + bias through day87_fast::wmma_mm_bias
    (day87_fast::wmma_mm where bias=False).

    A two-layer MLP, trained with FP16 products (CUDA):

        model = torch.nn.Sequential(day87_fast.Linear(768, 3072, device="cuda"),
                                    torch.nn.GELU(),
                                    day87_fast.Linear(3072, 768, device="cuda"))
        optimizer = torch.optim.AdamW(model.parameters())
        scaler = torch.amp.GradScaler("cuda")
        for x, target in batches:           # x: (batch, 768), FP32, batch a multiple of 128
            loss = torch.nn.functional.mse_loss(model(x), target)
            optimizer.zero_grad()
            scaler.scale(loss).backward()   # the loss scaled: no gradient underflows FP16
            scaler.step(optimizer)          # unscales the gradients first; skips a step
            scaler.update()                 # whose gradients overflowed

    The weight's and the input's gradients come out of the backward's products in FP16, as
    under autocast: without loss scaling, a gradient below FP16's smallest value (6e-8)
    becomes zero. GradScaler multiplies the loss, and so every gradient, by a large factor,
    and divides it out of the FP32 gradients before the optimizer's step.

    The same parameters, shapes, initialisation and state_dict keys as nn.Linear's:
    `weight` (out_features, in_features) and `bias` (out_features,). An nn.Linear's
    state_dict loads into it, and its state_dict into an nn.Linear.

    Precision, as autocast gives nn.Linear:
    - the parameters are FP32 by default, as nn.Linear's;
    - on CUDA, forward casts the weight and the input to FP16, one cast each (aten::_to_copy
      in a profile), and the output is the operator's: FP32;
    - with dtype=torch.float16 the weight is FP16 and nothing is cast; the bias stays FP32,
      the dtype in which the kernel adds it to its sums;
    - on the CPU, everything is float64, the operator's reference: the weight, input and bias
      are cast to float64 where they are not already, and the output is float64.

    The weight is read where nn.Linear keeps it: b = weight.t(), an (in, out) view with
    strides (1, in), column-major. On the CPU, with float64 parameters, the reference reads
    it in place, and the weight's gradient arrives in the weight's own layout: no copy of
    the weight on either pass. On CUDA, until a GPU run proves the kernels on a column-major
    b, forward makes the copy explicitly, weight.t().contiguous() (an aten::clone in a
    profile), at every call; the backward then copies the weight's gradient into the
    weight's layout too (AccumulateGrad).

    Any batch shape (*, in_features) that flattens to rows without a copy: the rows are a,
    which the operator takes row-major, and a copy of them would be hidden in this layer.
    On CUDA the operator's tile rule holds: the rows, out_features and in_features must be
    multiples of 128, 128 and 16; the error names the rule and what it saw.
    """

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device, dtype)
        if self.bias is not None and self.bias.dtype == torch.float16:
            # Kept in the kernel's accumulate dtype, so that no call casts it.
            accumulate = lesson_copy.accumulate_dtype(torch.float16)
            self.bias = torch.nn.Parameter(self.bias.detach().to(accumulate))

    def forward(self, input):
        operand_dtype = lesson_copy.input_dtype_on(input.device)
        # .to() returns the tensor itself, with no copy, where its dtype is already that.
        weight = self.weight.to(operand_dtype)
        # (*, in) as (rows, in): a view, so that no copy of the input is hidden here.
        rows = input.to(operand_dtype).view(-1, self.in_features)
        weight_transposed = weight.t()  # b (in x out): a view, column-major
        if not layouts.reads_column_major_b(input.device):
            # This device's kernels read b row-major only: the copy, made where it shows.
            weight_transposed = weight_transposed.contiguous()
        if self.bias is None:
            output = torch.ops.day87_fast.wmma_mm(rows, weight_transposed)
        else:
            bias = self.bias.to(lesson_copy.accumulate_dtype(operand_dtype))
            output = torch.ops.day87_fast.wmma_mm_bias(rows, weight_transposed, bias)
        return output.view(*input.shape[:-1], self.out_features)
