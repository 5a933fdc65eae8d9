"""The quick starts of docs/clients.md run as written against a real tuttid (its default pool
geometry: 32 KiB objects, 64 per block)."""

import os
import subprocess
import sys
import unittest

from tutti.testing import Tuttid

ROOT = os.path.join(os.environ.get("TEST_SRCDIR", os.getcwd()), "tutti")


class ExamplesTest(unittest.TestCase):
    def setUp(self):
        self.daemon = Tuttid(object_bytes=32 << 10, max_objects=64).start()

    def tearDown(self):
        self.daemon.cleanup()

    def run_example(self, argv):
        p = subprocess.run(argv + [self.daemon.socket], capture_output=True, text=True,
                           timeout=120)
        print(p.stdout, p.stderr)
        self.assertEqual(p.returncode, 0, p.stderr + self.daemon.log_tail())
        self.assertIn("blocks 10-11 hold exactly what blocks 0-1 held", p.stdout)
        self.assertIn("lookup: 2 of 2 blocks cached", p.stdout)

    def test_python_quickstart(self):
        self.run_example([sys.executable,
                          os.path.join(ROOT, "client/python/examples/quickstart.py")])

    def test_cpp_quickstart(self):
        self.run_example([os.path.join(ROOT, "client/cpp/quickstart")])


if __name__ == "__main__":
    unittest.main(verbosity=2)
