# End-to-end tests of the megascale binary (training, sampling, bad input).
ms_script_test(cli_end_to_end COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_cli.py
  LABELS cli)
