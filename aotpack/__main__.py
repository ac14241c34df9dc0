import sys

from aotpack.commands.cli import main

sys.exit(main())
