package ownership

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBoxOpensOnlyUnderItsKeyAndPurpose(t *testing.T) {
	k, err := NewKey([]byte("a key of the installation, 32 bytes or more"))
	require.NoError(t, err)
	other, err := NewKey([]byte("another installation's key, 32 bytes or more"))
	require.NoError(t, err)
	secret := []byte(`{"username":"u","password":"p"}`)

	boxed, err := k.Box("pull-credential", secret)
	require.NoError(t, err)
	assert.NotContains(t, string(boxed), "password", "boxed is encrypted")
	again, err := k.Box("pull-credential", secret)
	require.NoError(t, err)
	assert.NotEqual(t, boxed, again, "a fresh nonce each time")

	got, err := k.Open("pull-credential", boxed)
	require.NoError(t, err)
	assert.Equal(t, secret, got)

	_, err = other.Open("pull-credential", boxed)
	assert.ErrorIs(t, err, ErrNotBoxed, "another key")
	_, err = k.Open("something-else", boxed)
	assert.ErrorIs(t, err, ErrNotBoxed, "another purpose")
	changed := append([]byte(nil), boxed...)
	changed[len(changed)-1] ^= 1
	_, err = k.Open("pull-credential", changed)
	assert.ErrorIs(t, err, ErrNotBoxed, "changed")
	_, err = k.Open("pull-credential", boxed[:5])
	assert.ErrorIs(t, err, ErrNotBoxed, "cut")
	_, err = Key{}.Box("pull-credential", secret)
	assert.Error(t, err, "no key read yet")
}
