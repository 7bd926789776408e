"""The course's models, as this chapter exports them to ONNX (torch.onnx.export, dynamo=False).

- `MLP`          the digits MLP: chapter 01's layer structure (Linear + ReLU, a linear head) on torch.nn,
                 since chapter 01's MLP is built on scalar Values that no tracer can follow
- `course_cnn`   chapter 08's DigitsCNN, its torch.nn twin (custom=False): the custom-op version runs
                 numba kernels inside torch.autograd.Functions, which the tracer cannot see into
                 (export fails), so `course_cnn(from_custom=...)` copies a custom net's weights over
- `course_gpt`   chapter 04's GPT with its written-out attention (sdpa=False); no stand-in: if
                 chapter 04 breaks, this fails loudly
- `course_mamba` chapter 05's Mamba LM with the log-depth parallel scan. Tracing unrolls the scan's
                 Python loop into ceil(log2 T) rounds for the example's T, so the file is right only for
                 sequences up to the export length; the sequential scan unrolls T steps (one length
                 only), and the chunked scan needs cumprod, which the exporter rejects at opset 17
"""

import io
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, n_in=64, hidden=(128, 64), n_out=10):
        super().__init__()
        sizes = (n_in, *hidden)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
        self.head = nn.Linear(sizes[-1], n_out)

    def forward(self, x):
        for layer in self.layers:
            x = F.relu(layer(x))
        return self.head(x)


class LogitsOnly(nn.Module):
    """Wrap a model whose forward returns (logits, loss) so the exported graph has one output."""
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx):
        return self.model(idx)[0]


def course_cnn(from_custom=None, seed=0):
    """Chapter 08's DigitsCNN on torch.nn (1x8x8 -> 10), optionally with a custom-op DigitsCNN's weights."""
    from course_lib.custom_ops.cnn import DigitsCNN

    torch.manual_seed(seed)
    model = DigitsCNN(custom=False)
    if from_custom is not None:
        with torch.no_grad():
            for mine, theirs in ((model.conv1[0], from_custom.conv1), (model.conv2[0], from_custom.conv2)):
                mine.weight.copy_(theirs.weight)
                mine.bias.copy_(theirs.bias)
            model.head.load_state_dict(from_custom.head.state_dict())
    return model.eval()


def train_digits(model, epochs=4, seed=0):
    """A few epochs of chapter 08's Adam loop on the digits (images 1x8x8; the MLP sees them flattened)."""
    from course_lib.custom_ops.cnn import train
    from course_lib.data import load_digits

    net = model if not isinstance(model, MLP) else nn.Sequential(nn.Flatten(), model)
    acc, _, _ = train(net, load_digits(), epochs=epochs, seed=seed)
    model.eval()
    return acc


def course_gpt(vocab_size=65, block_size=64, n_layer=2, n_head=4, n_embd=64, seed=0):
    """Chapter 04's GPT (written-out attention, which the legacy exporter handles), forward(idx) -> logits."""
    from course_lib.gpt.model import GPT, GPTConfig

    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                    sdpa=False)
    return LogitsOnly(GPT(config)).eval()


def course_mamba(vocab_size=65, d_model=32, n_layer=2, seed=0):
    """Chapter 05's Mamba LM with the parallel scan, forward(idx) -> logits. Export it at the longest T you need."""
    from course_lib.mamba import Mamba, MambaConfig

    torch.manual_seed(seed)
    return LogitsOnly(Mamba(MambaConfig(vocab_size=vocab_size, d_model=d_model, n_layer=n_layer, scan="parallel"))).eval()


def export(model, example, input_names, output_names, dynamic_axes=None, opset=17):
    """torch.onnx.export with the legacy TorchScript exporter (dynamo=False): it needs only onnx."""
    buf = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), (example,), buf, input_names=input_names, output_names=output_names,
                          dynamic_axes=dynamic_axes, opset_version=opset, dynamo=False)
    return buf.getvalue()
