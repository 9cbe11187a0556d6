from provisioner.cli import main

raise SystemExit(main())
