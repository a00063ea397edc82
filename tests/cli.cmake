# End-to-end tests of the megascale binary (training, sampling, bad input).
ms_script_test(cli_end_to_end COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_cli.py
  LABELS cli)
# Signals and pipes: the log's reader gone, SIGHUP, Ctrl-C behind `| tee`
# are stop requests with a final checkpoint.
ms_script_test(cli_signals COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_signals.py
  LABELS cli)
# data prepare (issue 13): the val split in the token stream, JSONL, blending.
ms_script_test(cli_prepare COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_prepare.py
  LABELS cli)
# The fixed validation set (the same loss for every micro-batch size) and
# `megascale eval` on weights and checkpoints, with its bad input.
ms_script_test(cli_eval COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_eval.py
  LABELS cli)
# llm.c's model files (versions 3 and 5) as --init-from / eval / sample
# weights, with their bad headers.
ms_script_test(cli_llmc COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_llmc.py
  LABELS cli)
# --out-dir (every output under one directory, train.cfg, train.log) and
# --log-file.
ms_script_test(cli_outdir COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_outdir.py
  LABELS cli)
# Every subcommand's command line: the bare-able flags (--json, --search) in
# each form, and bad input (flags, values, files, directories), each named.
ms_script_test(cli_args COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_args.py
  LABELS cli)
