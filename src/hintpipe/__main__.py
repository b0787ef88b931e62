import sys

from hintpipe.cli import main

sys.exit(main())
