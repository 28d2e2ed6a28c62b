from rredcot_cli.cli import main

main()
