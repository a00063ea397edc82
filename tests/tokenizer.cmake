# Tokenizer (src/data/tokenizer*.c): unit tests, and parity with js-tiktoken
# (label tokenizer; needs node + npm, installs js-tiktoken into tests/node).
ms_c_test(test_tokenizer SOURCES unit/test_tokenizer.c LABELS unit
  ARGS ${CMAKE_SOURCE_DIR}/data/kjv.txt.gz)
target_compile_definitions(test_tokenizer PRIVATE MS_TEST_DATA_DIR="${CMAKE_SOURCE_DIR}/data")
# tok_encode: encode a file (parity test) or time the encoder (bench/tokenize).
add_executable(tok_encode unit/tok_encode.c)
target_link_libraries(tok_encode PRIVATE mscore)
ms_script_test(tokenizer_parity
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/node/parity.sh $<TARGET_FILE:tok_encode>
  LABELS tokenizer)
