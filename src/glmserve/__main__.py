from glmserve.cli import main

raise SystemExit(main())
