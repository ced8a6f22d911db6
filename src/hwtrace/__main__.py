import sys

from hwtrace.cli import main

sys.exit(main())
