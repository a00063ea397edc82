/* cub/cub.cuh (cuda-emu) - cub::DeviceRadixSort on the host: the two-call
 * temp-storage protocol of the real library (d_temp == NULL asks for the
 * size), then a stable sort by bits [begin_bit, end_bit) of the keys
 * (signed keys ordered as CUB orders them: sign bit flipped).  Pointers
 * are checked to be device memory.  Synchronous.
 */
#ifndef MSEMU_CUB_CUH
#define MSEMU_CUB_CUH

#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "../cuda_runtime.h"

namespace cub {

struct DeviceRadixSort {
    static const size_t temp_bytes_needed = 256;

    template <class K, class V, class NumItemsT>
    static cudaError_t SortPairs(void *d_temp, size_t &temp_bytes, const K *keys_in, K *keys_out,
                                 const V *vals_in, V *vals_out, NumItemsT num_items,
                                 int begin_bit = 0, int end_bit = sizeof(K) * 8,
                                 cudaStream_t stream = 0) {
        return sort(d_temp, temp_bytes, keys_in, keys_out, vals_in, vals_out, (long long)num_items,
                    begin_bit, end_bit, stream);
    }

    template <class K, class NumItemsT>
    static cudaError_t SortKeys(void *d_temp, size_t &temp_bytes, const K *keys_in, K *keys_out,
                                NumItemsT num_items, int begin_bit = 0, int end_bit = sizeof(K) * 8,
                                cudaStream_t stream = 0) {
        return sort(d_temp, temp_bytes, keys_in, keys_out, (const int *)nullptr, (int *)nullptr,
                    (long long)num_items, begin_bit, end_bit, stream);
    }

  private:
    template <class K, class V>
    static cudaError_t sort(void *d_temp, size_t &temp_bytes, const K *keys_in, K *keys_out,
                            const V *vals_in, V *vals_out, long long n, int begin_bit, int end_bit,
                            cudaStream_t stream) {
        static_assert(std::is_integral<K>::value, "msemu cub: integer keys only");
        typedef typename std::make_unsigned<K>::type U;
        if (!d_temp) {
            temp_bytes = temp_bytes_needed;
            return cudaSuccess;
        }
        const char *why = nullptr;
        if (temp_bytes < temp_bytes_needed)
            why = "temp storage smaller than reported";
        else if (n < 0 || begin_bit < 0 || end_bit > (int)sizeof(K) * 8 || begin_bit > end_bit)
            why = "bad num_items or bit range";
        else if (!msemu::stream_ok(stream))
            why = "bad stream";
        else if (!msemu::device_range_ok(d_temp, temp_bytes_needed, "SortPairs temp") ||
                 !msemu::device_range_ok(keys_in, n * sizeof(K), "SortPairs keys_in") ||
                 !msemu::device_range_ok(keys_out, n * sizeof(K), "SortPairs keys_out") ||
                 (vals_in &&
                  (!msemu::device_range_ok(vals_in, n * sizeof(V), "SortPairs values_in") ||
                   !msemu::device_range_ok(vals_out, n * sizeof(V), "SortPairs values_out"))))
            why = "pointers are not device memory";
        if (why) {
            fprintf(stderr, "msemu cub::DeviceRadixSort: %s\n", why);
            msemu::set_last_error(cudaErrorInvalidValue);
            return cudaErrorInvalidValue;
        }
        int nbits = end_bit - begin_bit;
        U mask = nbits >= (int)sizeof(U) * 8 ? (U) ~(U)0 : (U)(((U)1 << nbits) - 1);
        U flip = std::is_signed<K>::value ? (U)((U)1 << (sizeof(U) * 8 - 1)) : (U)0;
        std::vector<std::pair<U, long long>> v((size_t)n);
        for (long long i = 0; i < n; i++)
            v[(size_t)i] = {(U)((((U)keys_in[i] ^ flip) >> begin_bit) & mask), i};
        std::stable_sort(v.begin(), v.end(),
                         [](const std::pair<U, long long> &a, const std::pair<U, long long> &b) {
                             return a.first < b.first;
                         });
        std::vector<K> ko((size_t)n);
        std::vector<V> vo(vals_in ? (size_t)n : 0);
        for (long long i = 0; i < n; i++) {
            ko[(size_t)i] = keys_in[v[(size_t)i].second];
            if (vals_in) vo[(size_t)i] = vals_in[v[(size_t)i].second];
        }
        std::copy(ko.begin(), ko.end(), keys_out);
        if (vals_in) std::copy(vo.begin(), vo.end(), vals_out);
        return cudaSuccess;
    }
};

} // namespace cub

#endif
