"""Write scikit-learn's bundled digits as PNG files, one folder per class.

    python prepare_data.py                   # ./data/<class>/<n>.png (1,797 files)
    python prepare_data.py --corrupt 0.12    # also ./data-corrupt/: a copy where 12% of the
                                             # files are damaged (not decodable as PNG)

The folder-per-class layout lets muster's data manifest count files and classes on its own,
independently of the training code; the corrupted copy is how the demo shows a loader that
silently skips bad files being caught.
"""

from __future__ import annotations

import argparse
import random
import shutil
from pathlib import Path

from PIL import Image
from sklearn.datasets import load_digits

HERE = Path(__file__).resolve().parent


def write_digits(out: Path) -> int:
    digits = load_digits()
    if out.exists():
        shutil.rmtree(out)
    for index, (pixels, label) in enumerate(zip(digits.images, digits.target, strict=True)):
        folder = out / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        image = Image.fromarray((pixels * 255 / 16).astype("uint8"), mode="L")
        image.save(folder / f"{index:04d}.png")
    return len(digits.images)


def corrupt_copy(source: Path, out: Path, fraction: float, seed: int) -> int:
    """Copy `source` to `out` and overwrite `fraction` of the files with garbage."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(source, out)
    files = sorted(out.rglob("*.png"))
    damaged = random.Random(seed).sample(files, round(len(files) * fraction))
    for path in damaged:
        path.write_bytes(b"not a png: damaged in transit\n")
    return len(damaged)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=HERE / "data")
    parser.add_argument("--corrupt", type=float, default=0.0,
                        help="also write <out>-corrupt with this fraction of files damaged")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    count = write_digits(args.out)
    print(f"wrote {count} PNG files to {args.out}")
    if args.corrupt > 0:
        target = args.out.with_name(args.out.name + "-corrupt")
        damaged = corrupt_copy(args.out, target, args.corrupt, args.seed)
        print(f"wrote {target} with {damaged} of {count} files damaged")


if __name__ == "__main__":
    main()
