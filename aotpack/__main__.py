import sys

from aotpack.cli import main

sys.exit(main())
