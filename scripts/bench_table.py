"""What the benchmark scripts' summaries share (compare-allreduce.sh, bench-frame-mac.sh):
each runs its own summary with PYTHONPATH=scripts, as `python3 - RAW.csv TABLE.md`."""
import csv
import sys


def rows():
    """The rows of the raw CSV named by the first argument, as dicts."""
    with open(sys.argv[1]) as f:
        return list(csv.DictReader(f))


def size_name(b):
    """A byte count as the largest whole unit: 64 KiB, 100 MiB, 10 B."""
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= f and b % f == 0:
            return "%d %s" % (b // f, unit)
    return "%d B" % b


def publish(text):
    """Writes the table to the file named by the second argument, and prints it."""
    with open(sys.argv[2], "w") as f:
        f.write(text)
    print(text)
