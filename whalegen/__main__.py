from whalegen.cli import main

raise SystemExit(main())
