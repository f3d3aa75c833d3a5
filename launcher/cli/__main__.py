"""``python -m launcher.cli``: ``sres`` run straight from the package, without the console script.

What the tests spawn (and a checkout without ``pip install`` can use); unlike ``sres``
(``launcher.entry``) it latches no requeue signal and loads the whole CLI, ``sres hooks`` included.
"""

import sys

from launcher.cli.parser import main

sys.exit(main())
