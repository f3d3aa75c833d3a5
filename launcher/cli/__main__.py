import sys

from launcher.cli.parser import main

sys.exit(main())
