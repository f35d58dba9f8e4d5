"""What one profiled mode did (``Profile``): the figures bench and doctor read, and DDP ranks hand over as a dict."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Profile:
    """What one mode did: rates, the per-phase breakdown, machine load, and a timeline."""

    mode: str
    device: str
    images_per_s: float
    step_ms: float  # the median step
    data_wait_fraction: float
    windows: list[float]
    steps: int
    warmup: int  # the steps ignored before them: at least the loader's queue (queued_batches)
    phases_ms: dict[str, float]
    gpu_util: float | None
    gpu_clock_mhz: float | None
    gpu_power_w: float | None
    cpu_cores_busy: float
    own_cores_busy: float
    iowait: float
    disk_read_mb_s: float
    cores: int
    gpu_mem_peak_gb: float | None
    batch: int
    workers: int
    n_train: int
    n_val: int
    val_images_per_s: float | None = None
    busiest_core: float = 0.0  # busy share of the busiest core the run may use
    ram_used_gb: float | None = None  # the machine's, as psutil sees it (cache=ram runs, other jobs)
    swap_used_gb: float | None = None
    timeline: dict[str, list] = field(default_factory=dict)
    callbacks_ms: dict[str, float] = field(default_factory=dict)  # host ms per step in each trainer callback
    optimizer: str = ""  # the optimiser's class (optimizer=auto chooses by the run's length)
    mean_step_ms: float = 0.0  # wall time of the measured steps / steps: agrees with images_per_s when steps burst
    first_step_s: float | None = None  # from building the trainer to the end of its first step (set-up included)
    first_epoch_images_per_s: float | None = None  # the whole first epoch: its images / its wall time
    first_epoch_s: float | None = None  # from the first epoch's start to its end (None: the profile ended inside it)
    first_epoch_step_ms: list[float] = field(default_factory=list)  # host wall time of each of its steps but the first
    ranks: list[dict] = field(default_factory=list)  # DDP: each GPU's figures (the fields above are their total)
    forward_gflops: float | None = None  # one image's forward pass at the training size (monitor/efficiency.py)
    peak_tflops: float | None = None  # the GPU's dense bf16/fp16 peak, per GPU (None: not in the table, or no GPU)
    train_tflops: float | None = None  # achieved: images/s x 3 x forward GFLOPs
    mfu: float | None = None  # train_tflops over the peak of the GPUs trained on
    machine_samples: int | None = None  # the system probe's samples behind the GPU, CPU and disk figures (0: none,
    # and those figures are not measurements; None: a result from before this was recorded)
    probe_lost: str | None = None  # why the system probe ended on its own during the profile

    def to_dict(self) -> dict:
        return asdict(self)
