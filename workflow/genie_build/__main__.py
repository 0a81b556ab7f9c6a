from genie_build.cli import main

raise SystemExit(main())
