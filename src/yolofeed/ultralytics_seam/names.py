"""Every Ultralytics name yolofeed uses, imported here once the installed version is checked (``version``), each with
who uses it; a release that moved one says which, in one line. The stages take them from the package
(``yolofeed.ultralytics_seam``)."""

from __future__ import annotations

import ultralytics

from yolofeed.errors import UltralyticsVersionError
from yolofeed.ultralytics_seam.version import FIX, RANGE

try:  # every Ultralytics name yolofeed uses, and who uses it; a release that moved one says which, in one line
    import ultralytics.engine.validator as _validator_module  # validation_beside: the bar and timers of __call__
    import ultralytics.models.yolo.detect.train as _detect_train_module  # figures: the train_batch grids it draws
    import ultralytics.models.yolo.detect.val as _detect_val_module  # figures: the image grids it draws
    import ultralytics.models.yolo.obb.val as _obb_val_module  # figures: the image grids it draws
    import ultralytics.nn.tasks as _tasks_module  # model.other_family: a yaml's modules, as parse_model finds them
    import ultralytics.utils.metrics as _metrics_module  # figures: the final validation's figures, drawn elsewhere
    import ultralytics.utils.nms as _nms_module  # train.val_nms: the validation's NMS, copied
    import ultralytics.utils.tqdm as _tqdm  # progress_bar_drawn (read at call time: tests patch it)
    from ultralytics import YOLO  # train.run, bench.parity: the model a run trains
    from ultralytics.cfg import (  # cli, train.keys, augment.hyp: Ultralytics' keys, defaults and key=value reading
        DEFAULT_CFG_DICT,
        check_cfg,
        get_cfg,
        get_save_dir,  # train.trainer: the run folder, checked before Ultralytics makes it
        merge_equals_args,  # cli: 'epochs = 1' and 'imgsz=[3,' '640]' read as one word, as its CLI reads them
        parse_key_value_pair,
        smart_value,
    )
    from ultralytics.data import utils as _data_utils  # pack.verify: the module its label rules are copied from
    from ultralytics.data.dataset import YOLODataset  # bench.parity: builds Ultralytics' label caches up front
    from ultralytics.data.utils import (  # pack: which files a split holds and how a sample is checked
        DATASET_KEY_TYPES,  # pack.source: the data yaml's keys' types, as check_det_dataset checks them
        IMG_FORMATS,
        check_det_dataset,
        exif_size,
        get_split_fraction,
        img2label_paths,
    )
    from ultralytics.models.yolo.detect import (
        DetectionTrainer,  # train.trainer, bench.ceiling subclass it
        DetectionValidator,  # train.val_metrics: whose statistics it batches
    )
    from ultralytics.models.yolo.obb import OBBTrainer  # train.tasks: FastOBBTrainer subclasses it
    from ultralytics.models.yolo.pose import PoseTrainer  # train.tasks: FastPoseTrainer subclasses it
    from ultralytics.models.yolo.segment import SegmentationTrainer  # train.tasks: FastSegmentationTrainer
    from ultralytics.nn.autobackend import (
        AutoBackend,  # train.validation: the final validation's model, warmed
        check_class_names,  # pack.source: the data yaml's names, as Ultralytics reads
    )
    from ultralytics.nn.modules.block import (  # train.graphed: layers whose input reaches one convolution
        C2f,
        C3k2,  # a C2f with C2f's forward (HalvesC3k2 subclasses it)
    )
    from ultralytics.nn.modules.conv import Concat, Conv  # train.graphed: FusedConv subclasses Conv
    from ultralytics.nn.modules.head import (
        Detect,  # train.graphed: TokenMajorDetect subclasses it
        RTDETRDecoder,  # model.other_family: the heads of the model families yolofeed does not train
        WorldDetect,
        YOLOEDetect,
    )
    from ultralytics.nn.tasks import (  # train.keys: a model's task
        DetectionModel,
        guess_model_task,
        torch_safe_load,  # train.run: a .pt read as YOLO() reads it, to check it first
        yaml_model_load,
    )
    from ultralytics.optim import muon as _muon  # train.musgd: the module its copy of muon_update comes from
    from ultralytics.optim.muon import MuSGD, zeropower_via_newtonschulz5  # train.musgd subclasses and calls them
    from ultralytics.utils import (  # paths, config
        DATASETS_DIR,
        DEFAULT_CFG,
        LOCAL_RANK,
        LOGGER,
        RANK,
        SETTINGS,
        VERBOSE,
        YAML,
    )
    from ultralytics.utils.checks import (  # train.run: cfg=; pack.source: data=coco8.yaml; as yolo train finds them
        REMOTE_FILE_PREFIXES,  # remote_model: the model= names YOLO() fetches before it loads them
        check_file,
        check_imgsz,  # train_side: the side Ultralytics trains at, and the values it refuses
        check_model_file_from_stem,  # weights_name: model=yolo11n is yolo11n.pt to YOLO()
        check_yaml,
    )
    from ultralytics.utils.downloads import (  # downloads_weights: what Ultralytics fetches by name
        GITHUB_ASSETS_NAMES,
        attempt_download_asset,  # fetch_weights: as Model._load fetches a name it knows
    )
    from ultralytics.utils.files import get_latest_run  # train.run: a bare 'resume' takes the newest last.pt here
    from ultralytics.utils.loss import (  # train.loss subclasses them
        BboxLoss,
        E2EDetectLoss,
        E2ELoss,
        KeypointLoss,
        RotatedBboxLoss,
        v8DetectionLoss,
        v8OBBLoss,
        v8PoseLoss,
        v8SegmentationLoss,
    )
    from ultralytics.utils.metrics import (  # train.loss: the box losses' CIoU and ProbIoU; the validation's matrix
        ConfusionMatrix,
        bbox_iou,
        probiou,
    )
    from ultralytics.utils.nms import TorchNMS, non_max_suppression  # train.val_nms: the validation's NMS
    from ultralytics.utils.ops import (  # pack.verify, train.loss: box formats; loader.val: OBB's as Format makes them
        crop_mask,  # train.loss: the segment loss's crop, on the batched rows
        segments2boxes,
        xywh2xyxy,
        xywhr2xyxyxyxy,
        xyxy2xywh,
        xyxyxyxy2xywhr,
    )

    # pack.verify: Pillow's opener, without the pi-heif auto-install Ultralytics' patched Image.open does (nothing
    # may install or download at run time)
    from ultralytics.utils.patches import _image_open as pil_open
    from ultralytics.utils.patches import imread  # pack.verify: the decoder Ultralytics' datasets use
    from ultralytics.utils.tal import (  # train.loss
        RotatedTaskAlignedAssigner,
        TaskAlignedAssigner,
        bbox2dist,
        make_anchors,
        rbox2dist,
    )
    from ultralytics.utils.torch_utils import (  # train: devices, DDP rank 0 first, the model inside DDP/compile
        EarlyStopping,  # train.trainer: whether early stopping may stop the run (may_stop)
        get_flops,  # measure.profile: a model's forward GFLOPs, as Ultralytics' model summary counts them
        parse_device,
        strip_optimizer,  # train.checkpoints: the final checkpoints, written to a temporary file
        torch_distributed_zero_first,
        unwrap_model,
    )
except ImportError as e:
    raise UltralyticsVersionError(f"Ultralytics {ultralytics.__version__}: {e}; yolofeed works with Ultralytics "
                                  f"{RANGE}: {FIX}") from None


__all__ = [  # the names above; the modules (``_data_utils``...) are read by the seam's checks and wrappers
    "AutoBackend", "BboxLoss", "C2f", "C3k2", "Concat", "Conv", "DATASET_KEY_TYPES", "DATASETS_DIR", "DEFAULT_CFG",
    "DEFAULT_CFG_DICT", "Detect", "DetectionModel", "DetectionTrainer", "DetectionValidator", "E2EDetectLoss",
    "E2ELoss", "EarlyStopping", "GITHUB_ASSETS_NAMES", "IMG_FORMATS", "KeypointLoss", "LOCAL_RANK", "LOGGER", "MuSGD",
    "OBBTrainer", "PoseTrainer", "RANK", "REMOTE_FILE_PREFIXES", "RTDETRDecoder", "RotatedBboxLoss",
    "RotatedTaskAlignedAssigner",
    "SETTINGS",
    "SegmentationTrainer", "TaskAlignedAssigner", "VERBOSE", "WorldDetect", "YAML", "YOLO", "YOLODataset",
    "YOLOEDetect",
    "attempt_download_asset",
    "bbox2dist", "bbox_iou", "ConfusionMatrix",
    "check_cfg", "check_class_names", "check_det_dataset", "check_file", "check_imgsz", "check_model_file_from_stem",
    "check_yaml", "crop_mask",
    "exif_size", "get_cfg", "get_flops", "get_latest_run", "get_save_dir", "get_split_fraction", "guess_model_task",
    "img2label_paths", "imread", "make_anchors", "merge_equals_args", "parse_device", "parse_key_value_pair",
    "pil_open", "probiou",
    "non_max_suppression", "TorchNMS",
    "rbox2dist", "segments2boxes", "smart_value", "strip_optimizer", "torch_distributed_zero_first", "torch_safe_load",
    "unwrap_model", "v8DetectionLoss", "v8OBBLoss", "v8PoseLoss", "v8SegmentationLoss", "xywh2xyxy", "xywhr2xyxyxyxy",
    "xyxy2xywh", "xyxyxyxy2xywhr", "yaml_model_load", "zeropower_via_newtonschulz5",
    "_data_utils", "_detect_train_module", "_detect_val_module", "_metrics_module", "_nms_module",
    "_obb_val_module", "_muon", "_tasks_module", "_tqdm",
    "_validator_module",
]
