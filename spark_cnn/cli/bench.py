"""`spark-cnn bench-sidecar`: dynamic batching on vs off vs the device alone, without Spark."""

from __future__ import annotations

import argparse

from spark_cnn.cli.common import write_json
from spark_cnn.task.run_options import DECODE_PLACES, PIXELS_DECODE_PLACE, PRECISIONS


def register(commands) -> None:
    parser = commands.add_parser("bench-sidecar", help="dynamic batching on vs off vs the device alone (no Spark)")
    parser.add_argument("--model", default="mobilenet_v3_small",
                        help="torchvision model (random weights; a detection or segmentation builder sends each image "
                        "at its own size), or identity: a near-free model that measures what serving alone costs")
    parser.add_argument("--clients", type=int, default=4, help="client processes (default 4)")
    parser.add_argument("--request-size", type=int, default=1, help="images per request (default 1)")
    parser.add_argument("--batch-size", default="auto", help="target batch with batching on: auto or N")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--decode", default=PIXELS_DECODE_PLACE, choices=DECODE_PLACES,
                       help="task: clients send pixels; sidecar/gpu: clients send JPEG files")
    parser.add_argument("--precision", default="auto", choices=PRECISIONS)
    parser.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--threads", type=int, help="torch CPU threads in the sidecar and the device-only run")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per mode and round")
    parser.add_argument("--warmup", type=float, default=3.0, help="warm-up seconds before each measurement")
    parser.add_argument("--rounds", type=int, default=2, help="off/on alternations (default 2)")
    parser.add_argument("--in-flight", type=int,
                        help="requests each client keeps in flight (default: 64 images' worth)")
    parser.add_argument("--image-size", type=int,
                        help="square input side in pixels (resize and crop; default: the model's own, 32 for identity)")
    parser.add_argument("--json", help="write the results here")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from spark_cnn.bench.sidecar_bench import SidecarBenchConfig, run_sidecar_bench
    from spark_cnn.config import parse_batch_size
    from spark_cnn.errors import ConfigError

    if args.clients < 1 or args.request_size < 1 or args.rounds < 1 or args.seconds <= 0 or (args.image_size or 1) < 1:
        raise ConfigError("--clients, --request-size, --rounds, --seconds and --image-size must be positive")
    config = SidecarBenchConfig(
        model=args.model, clients=args.clients, request_size=args.request_size,
        batch_size=parse_batch_size(args.batch_size), device=args.device, decode=args.decode,
        precision=args.precision, channels_last=args.channels_last, compile=args.compile, threads=args.threads,
        warmup_s=args.warmup, measure_s=args.seconds, rounds=args.rounds, max_in_flight=args.in_flight,
        image_size=args.image_size)
    result = run_sidecar_bench(config)
    print(f"{config.model} on {result['machine']}")
    shape = ("x".join(map(str, result["input_shape"])) if result["input_shape"] else
             "own-size (" + ", ".join(f"{h}x{w}" for h, w in result["input_sizes"]) + ")")
    print(f"  on           {result['on']:9.1f} img/s  (batch {result['batch_size']}; {shape} input, "
          f"{result['on_gb_per_s']} GB/s into the sidecar)")
    print(f"  off          {result['off']:9.1f} img/s  (batch {config.request_size})")
    print(f"  device_only  {result['device_only']:9.1f} img/s")
    print(f"  on/off {result['on_over_off']}x   on/device_only {result['on_over_device_only']}")
    write_json(args.json, result)
    return 0
