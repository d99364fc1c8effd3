from hocc.bench.cli import main

main()
