import torch
import torch.cuda.amp as cuda_amp

try:
    from apex import amp as apex_amp
except ImportError:
    apex_amp = None


def get_autocast(args):
    if args.apex:
        return None
    return cuda_amp.autocast(enabled=args.amp, dtype=torch.float16)


def get_scaler(args):
    return cuda_amp.GradScaler(init_scale=args.init_scale, enabled=args.amp)


def current_dtype():
    return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else torch.float32
