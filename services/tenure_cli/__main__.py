import sys

from services.tenure_cli.main import main

sys.exit(main())
