"""Issue 19 item 13: a library's own unittest tests call its guarded stage (one through
``assertRaises``, one directly) with grad disabled; the events name the test file's lines,
not unittest's ``case.py``."""

import os
import unittest

TWIN = {
    "policy": """
        [[rules]]
        target = "meshlib.fitting:fit"
        action = "enable_grad"
    """,
    "files": {
        "meshlib/__init__.py": "",
        "meshlib/fitting.py": """
            import torch


            def fit(x):
                if x.numel() == 0:
                    raise ValueError("empty")
                x = x.clone().requires_grad_()
                (x * x).sum().backward()
                return x.grad
        """,
        "meshlib/tests/__init__.py": "",
        "meshlib/tests/test_fitting.py": """
            import os
            import unittest

            import torch

            from meshlib.fitting import fit


            class FitTest(unittest.TestCase):
                def setUp(self):
                    torch.set_grad_enabled(bool(os.environ.get("TWIN_HANDFIX")))

                def tearDown(self):
                    torch.set_grad_enabled(True)

                def test_fit(self):
                    self.assertEqual(fit(torch.ones(2)).tolist(), [2.0, 2.0])

                def test_empty(self):
                    self.assertRaises(ValueError, fit, torch.ones(0))
        """,
    },
    "modes": {
        "fix": {"events": ["grad_mode/enable_grad", "grad_mode/enable_grad"], "like": "handfix"},
    },
}


def main():
    suite = unittest.defaultTestLoader.loadTestsFromName("meshlib.tests.test_fitting")
    with open(os.devnull, "w") as quiet:
        result = unittest.TextTestRunner(stream=quiet).run(suite)
    print("run", result.testsRun, "failures", len(result.failures), "errors", len(result.errors))
    print(sorted(str(test) for test, _ in result.errors + result.failures))
