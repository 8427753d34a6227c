"""`spark-cnn bench-decode`: decode + preprocess images/s on one core, full vs reduced-DCT vs simplejpeg."""

from __future__ import annotations

import argparse

from spark_cnn.cli.common import write_json


def register(commands) -> None:
    parser = commands.add_parser("bench-decode",
                                 help="decode+preprocess images/s on one core: full vs reduced-DCT JPEG decoding")
    parser.add_argument("--images", type=int, default=12, help="files per image set (default 12)")
    parser.add_argument("--seconds", type=float, default=2.0, help="measured seconds per case and round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over all cases (default 2)")
    parser.add_argument("--resize", type=int, default=256, help="shorter side before cropping (default 256)")
    parser.add_argument("--crop", type=int, default=224, help="centre crop (default 224)")
    parser.add_argument("--sets", default="bench_320,large",
                        help="image sets: bench_320 (320 px JPEGs), large (2400-4000 px JPEGs); default both")
    parser.add_argument("--json", help="write the results here")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from spark_cnn.bench.decode_bench import RESIZE_WHOLE_CASE, DecodeBenchConfig, run_decode_bench

    config = DecodeBenchConfig(images=args.images, seconds=args.seconds, rounds=args.rounds, resize=args.resize,
                               crop=args.crop, sets=tuple(s for s in args.sets.split(",") if s))
    result = run_decode_bench(config)
    print(f"decode + resize {config.resize} / crop {config.crop}, one core: {result['machine']}")
    for set_name, data in result["sets"].items():
        print(f"{set_name}: {data['files']} files, {', '.join(data['image_sizes'])}, "
              f"{data['mean_file_bytes'] // 1024} KiB on average")
        print(f"  {'case':20s} {'img/cpu-s':>9s} {'x full':>7s} {'img/s wall':>10s} {'scales':>8s} "
              f"{'mean':>6s} {'p99':>5s} {'max':>5s}")
        for name, case in data["cases"].items():
            scales = ",".join(f"1/{s}" for s in case["dct_scales"])
            print(f"  {name:20s} {case['images_per_cpu_s']:9.1f} {case['vs_full']:7.2f} "
                  f"{case['images_per_wall_s']:10.1f} {scales:>8s} "
                  f"{case['mean_diff']:6.2f} {case['p99_diff']:5.0f} {case['max_diff']:5d}")
        whole = data["cases"][RESIZE_WHOLE_CASE]
        print(f"  {RESIZE_WHOLE_CASE} resizes the whole picture before cropping; its pixels differ from "
              f"reduced's by at most {whole['max_diff_vs_reduced']}")
    if not result["simplejpeg"]:
        print("simplejpeg is not installed: its cases were skipped (pip install 'spark_cnn[fast-jpeg]')")
    write_json(args.json, result)
    return 0
