import sys

from trainer.launch.cli import main

sys.exit(main())
