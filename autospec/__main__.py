import sys

from autospec.cli import main

sys.exit(main())
