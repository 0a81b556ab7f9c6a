from genie_build.cli import program

program()
