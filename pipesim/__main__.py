import sys

from pipesim.cli import main

sys.exit(main())
