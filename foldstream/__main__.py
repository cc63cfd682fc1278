from foldstream.cli import main

main()
