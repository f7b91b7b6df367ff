"""The Kafka protocol listener (issue 20).

kio (the codec library) imports `hypothesis` when it is installed, only to register test
strategies for its phantom types. In a broker that import costs 0.2 s, and in a working
directory without a `.hypothesis/` folder it builds hypothesis's character map first
(about 2 s, on the broker's event loop when the listener starts) and leaves that folder
behind in the broker's directory. So kio is first imported here with `hypothesis` hidden,
unless the process has already imported hypothesis (a test process that uses it keeps
kio's strategies). Nothing in kraftlog uses those strategies.
"""
from __future__ import annotations

import sys


def _import_kio_without_hypothesis() -> None:
    if "hypothesis" in sys.modules:
        return
    sys.modules["hypothesis"] = None   # `import hypothesis...` raises ImportError meanwhile
    try:
        import kio.static._phantom  # noqa: F401  (the module that imports hypothesis)
    except ImportError:
        pass   # a kio without that module: nothing to hide from
    finally:
        if sys.modules.get("hypothesis", 0) is None:
            del sys.modules["hypothesis"]


_import_kio_without_hypothesis()
