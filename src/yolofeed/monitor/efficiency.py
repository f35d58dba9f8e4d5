"""Efficiency, not utilisation: the training FLOP/s a run achieves and its share of the GPU's matrix peak (MFU).

NVML's utilisation is the share of time some kernel runs, not the share of the chip doing work: yolo11n at 100 %
"GPU busy" on an H200 uses a few per cent of its bf16 matrix rate. The figures here say how far a run is from that
rate.

How the FLOPs are counted: ``train_gflops_per_image`` = 3 x the model's forward GFLOPs for one image at the training
size, as Ultralytics counts them (``get_flops``: THOP, a multiply-add as 2 FLOPs). The 3 is the usual estimate of a
training step: the forward pass, and a backward pass of about twice its cost (the gradients of the activations and of
the weights). The loss, the assigner, the optimiser and the augmentation are left out (a small share for a
detector). The peak is the vendor's dense (not sparse) bf16/fp16 tensor-core rate (``PEAK_TFLOPS``), which AMP's
matrix products run at; a GPU not in the table gets no MFU, only FLOP/s.
"""

from __future__ import annotations

# Dense bf16/fp16 tensor-core TFLOP/s from NVIDIA's datasheets, matched in this order against the CUDA device name
# (the first name that occurs in it wins: "H100 PCIe" before "H100").
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("B200", 2250.0), ("GH200", 989.4), ("H200", 989.4), ("H100 PCIe", 756.5), ("H100 NVL", 835.5), ("H100", 989.4),
    ("H800", 989.4), ("A100", 312.0), ("A800", 312.0), ("L40S", 362.1), ("L40", 181.0), ("L4", 121.0),
    ("A10G", 70.0), ("A10", 125.0), ("A30", 165.0), ("RTX 4090", 165.2), ("RTX 3090", 71.0), ("V100", 125.0),
    ("T4", 65.0),
)
BACKWARD_FACTOR = 3.0  # a training step's FLOPs over its forward pass's


def peak_tflops(device_name: str) -> float | None:
    """The dense bf16/fp16 tensor-core peak of a GPU by its CUDA name ("NVIDIA H200"), or None if not in the table."""
    return next((tflops for key, tflops in PEAK_TFLOPS if key in device_name), None)


def train_gflops_per_image(forward_gflops: float) -> float:
    """The FLOPs of one image's training step, from the model's forward GFLOPs at the training size."""
    return BACKWARD_FACTOR * forward_gflops


def achieved(images_per_s: float, forward_gflops: float | None, peak: float | None,
             gpus: int = 1) -> tuple[float | None, float | None]:
    """(training TFLOP/s, MFU as a fraction of ``gpus`` x ``peak``); None where a figure is missing or zero.

    Raises:
        ValueError: a negative rate or FLOP count (the inputs are checked, as the throughput's are).
    """
    if images_per_s < 0 or (forward_gflops is not None and forward_gflops < 0):
        raise ValueError(f"images/s {images_per_s} and GFLOPs {forward_gflops} must not be negative")
    if not forward_gflops:
        return None, None
    tflops = images_per_s * train_gflops_per_image(forward_gflops) / 1e3
    return tflops, (tflops / (peak * gpus) if peak else None)
