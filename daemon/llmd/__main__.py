from llmd.cli.main import main

main(prog_name="llmd")
