"""A benchmark run empties its directory: benchmark_host_dir must be the benchmark's own."""

import pytest

from socketwise.measure.hostdir import host_dir_error

KEPT = [
    ("/var/lib/socketwise/tuning-backup.json", "host_tuning's record (host_tuning_backup_path)"),
    ("/var/lib/socketwise/tuning-report.json", "host_tuning's report (host_tuning_report_path)"),
    ("/var/lib/socketwise/bandwidth.json", "the memory bandwidth measured once"),
]


@pytest.mark.parametrize(
    "path",
    ["/var/lib/socketwise/bench", "/var/lib/socketwise/rollout-gate", "/var/lib/socketwise/a/b_1"],
)
def test_a_directory_of_the_benchmark_s_own_is_taken(path):
    assert host_dir_error(path, KEPT) is None


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/etc", "is not a directory under /var/lib/socketwise"),
        ("/var/lib/socketwise", "is not a directory under /var/lib/socketwise"),
        ("/var/lib/socketwise-bench", "is not a directory under /var/lib/socketwise"),
        ("var/lib/socketwise/bench", "is not a directory under /var/lib/socketwise"),
        ("/var/lib/socketwise/bench/", "not a normalized path"),
        ("/var/lib/socketwise//bench", "not a normalized path"),
        ("//var/lib/socketwise/bench", "not a normalized path"),
        ("/var/lib/socketwise/./bench", "not a normalized path"),
        ("/var/lib/socketwise/../socketwise/bench", "not a normalized path"),
        ("/var/lib/socketwise/.hidden", "'.hidden' is not a name"),
        ("/var/lib/socketwise/run dir", "'run dir' is not a name"),
    ],
)
def test_a_directory_not_written_as_the_benchmark_s_own_is_refused(path, why):
    error = host_dir_error(path, KEPT)
    assert error.startswith(f"benchmark_host_dir={path}: ")
    assert why in error
    assert "; " in error and "\n" not in error


def test_an_unnormalized_directory_is_told_how_to_write_it():
    assert host_dir_error("/var/lib/socketwise//bench/", KEPT).endswith(
        "; write it as /var/lib/socketwise/bench"
    )


@pytest.mark.parametrize(
    ("path", "relation", "kept"),
    [
        ("/var/lib/socketwise/tuning-backup.json", "it is", "tuning-backup.json"),
        ("/var/lib/socketwise/bandwidth.json", "it is", "bandwidth.json"),
        ("/var/lib/socketwise/tuning-report.json/x", "it lies inside", "tuning-report.json"),
        ("/var/lib/socketwise/tuning", "it holds", "tuning/backup.json"),
        ("/var/lib/socketwise/tune", "its load generator's", "tune-load/backup.json"),
    ],
)
def test_a_directory_that_would_empty_what_the_kit_keeps_is_refused(path, relation, kept):
    kept_paths = KEPT + [
        ("/var/lib/socketwise/tuning/backup.json", "a moved backup"),
        ("/var/lib/socketwise/tune-load/backup.json", "another moved backup"),
    ]
    error = host_dir_error(path, kept_paths)
    assert error.startswith(f"benchmark_host_dir={path}: {relation}")
    assert f"/var/lib/socketwise/{kept}, " in error
    assert error.endswith(
        "give a directory of the benchmark's own such as /var/lib/socketwise/bench"
    )
