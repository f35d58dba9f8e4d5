"""The training FLOP/s and MFU that bench and doctor report beside NVML utilisation (monitor/efficiency.py)."""

from __future__ import annotations

import pytest

from yolofeed.monitor import efficiency


@pytest.mark.parametrize("name, peak", [("NVIDIA H200", 989.4), ("NVIDIA H100 80GB HBM3", 989.4),
                                        ("NVIDIA H100 PCIe", 756.5), ("NVIDIA GH200 480GB", 989.4),
                                        ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A10G", 70.0),
                                        ("NVIDIA A10", 125.0), ("NVIDIA L40S", 362.1), ("NVIDIA L4", 121.0),
                                        ("Tesla T4", 65.0), ("NVIDIA GeForce RTX 4090", 165.2),
                                        ("Some Future GPU", None)])
def test_the_peak_is_the_first_table_name_in_the_device_name(name, peak):
    assert efficiency.peak_tflops(name) == peak


def test_training_flops_are_three_forward_passes_and_mfu_their_share_of_the_peak():
    tflops, mfu = efficiency.achieved(1000.0, 6.5, 989.4)  # yolo11n at 640: 6.5 forward GFLOPs an image
    assert tflops == pytest.approx(19.5) and mfu == pytest.approx(19.5 / 989.4)
    assert efficiency.achieved(1000.0, 6.5, 989.4, gpus=2)[1] == pytest.approx(19.5 / 989.4 / 2)
    assert efficiency.achieved(1000.0, 6.5, None) == (pytest.approx(19.5), None)  # a GPU not in the table: no MFU
    assert efficiency.achieved(1000.0, None, 989.4) == (None, None)  # FLOPs Ultralytics could not count
    with pytest.raises(ValueError):
        efficiency.achieved(-1.0, 6.5, 989.4)
