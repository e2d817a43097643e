"""Tests of dsh_toolhost. A tool's exception is logged by the host; tests that
check it use assertLogs, the rest keep the run quiet."""
import logging

logging.getLogger("dsh_toolhost").addHandler(logging.NullHandler())
