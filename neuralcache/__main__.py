import sys

from .admin.cli import main

sys.exit(main())
